"""``client_spec(...)``: what a strategy tells every client, for a strategy built in your own ServerApp.

pflower's runner builds this from the config (``server_app.run_plan.RunPlan.client_spec``); a Flower app
that builds a strategy itself calls :func:`client_spec` with the local-training settings. The
model and data parts are left out: the clients that run pflower's client builder
(:func:`pflower.client_app.build_clientapp`) bring their own.
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Mapping
from typing import Any

from pflower.protocol.wire import OPTIMIZER_STATES, OPTIMIZERS


class SetupError(ValueError):
    """A strategy built in a user's ServerApp with arguments it cannot run with; the message names
    the argument and the fix."""

    user_error = True  # one `pflower:` line in Flower's log, not a traceback (pflower.logs)


#: what every client reads from the spec (the rest has defaults)
REQUIRED = ("run", "seed", "device", "train")
REQUIRED_TRAIN = ("epochs", "batch_size", "lr", "momentum", "weight_decay", "optimizer")


def check_client_spec(spec: Any) -> None:
    """Refuse a client spec a client could not train from: not a mapping, empty, or without the
    keys :func:`client_spec` writes (a hand-written ``{}`` or ``{"lr": 0.1}``)."""
    how = "build it with pflower.strategies.client_spec(lr=..., local_epochs=..., batch_size=...)"
    if not hasattr(spec, "keys"):
        raise SetupError(f"client_spec must be a mapping, got {type(spec).__name__}: {how}")
    if not spec:
        raise SetupError(f"client_spec is empty: the clients would not know how to train; {how}")
    missing = [k for k in REQUIRED if k not in spec]
    train = spec.get("train")
    if not missing and hasattr(train, "keys"):
        missing = [f"train.{k}" for k in REQUIRED_TRAIN if k not in train]
    elif not missing:
        missing = ["train (a mapping)"]
    if missing:
        raise SetupError(f"client_spec lacks {missing} (it has {sorted(spec)}): {how}")


#: keywords pflower took before it took Flower's names -> Flower's name
RENAMED = {"fraction": "fraction_train", "min_clients": "min_train_nodes", "min_available": "min_available_nodes"}
#: Flower FedAvg keywords pflower's methods do not take -> why
NOT_TAKEN = {
    "min_evaluate_nodes": "pflower's per-round evaluation draws fraction_evaluate of the known clients (at least one)",
    "weighted_by_key": "pflower's methods weigh replies by their num-examples, as the message contract says",
    "arrayrecord_key": "pflower's messages name their records themselves (the message contract)",
    "configrecord_key": "pflower's messages name their records themselves (the message contract)",
    "train_metrics_aggr_fn": "pflower aggregates the replies' metrics itself (each round's record: .history)",
    "evaluate_metrics_aggr_fn": "pflower aggregates the replies' metrics itself (each round's record: .history)",
}


def check_flower_keywords(keywords: dict[str, Any]) -> None:
    """Refuse, in one line, a keyword of pflower's old names or one of Flower's FedAvg that a
    pflower method does not take (left alone it would be taken for a method option and refused
    less clearly)."""
    for name in keywords:
        if name in RENAMED:
            raise SetupError(f"{name}= is Flower's {RENAMED[name]}= in pflower's strategies: pass {RENAMED[name]}=")
        if name in NOT_TAKEN:
            raise SetupError(f"{name}= is not taken: {NOT_TAKEN[name]}; remove it")


def client_spec(
    *,
    lr: float = 0.01,
    local_epochs: int = 1,
    batch_size: int = 32,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    optimizer: str = "sgd",
    optimizer_state: str = "fresh",
    local_steps: int | None = None,
    seed: int = 42,
    device: str = "auto",
    run: str | None = None,
    rounds: int | None = None,
    lr_schedule: dict[str, Any] | None = None,
    client_state_dir: str | None = None,
    state_versions: int = 2,
    deterministic: bool = False,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The client spec of a strategy constructor: ``FedCMD(Net(), client_spec(lr=0.05), num_clients=10)``.

    ``run``: the name under which clients keep their personal layers (a fresh token by default);
    ``client_state_dir``: where simulated clients keep them (deployed nodes: their ``state-dir``);
    ``lr_schedule`` with ``rounds``: the per-round learning rate (conf/config.yaml's lr_schedule);
    ``optimizer_state``: ``fresh`` (a new local optimizer every round) or ``kept`` (each client's
    runs on from its previous round, kept with its personal state).
    pflower's runner builds its spec with this too (``server_app.run_plan.RunPlan.client_spec``), adding
    the data spec, the model entries and ``state_versions`` from the config."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {optimizer!r}")
    if optimizer_state not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer_state must be one of {list(OPTIMIZER_STATES)}, got {optimizer_state!r}")
    return {
        "run": run or secrets.token_hex(4),
        "client_state_dir": client_state_dir,
        "state_versions": int(state_versions),
        "seed": int(seed),
        "device": str(device),
        "deterministic": bool(deterministic),
        "data": {} if data is None else data,
        "train": {
            "epochs": int(local_epochs),
            "batch_size": int(batch_size),
            "lr": float(lr),
            "momentum": float(momentum),
            "weight_decay": float(weight_decay),
            "optimizer": str(optimizer),
            "steps": None if local_steps is None else int(local_steps),
            # only "kept" travels: a spec without it is one every pflower client reads
            **({"optimizer_state": "kept"} if optimizer_state == "kept" else {}),
        },
        **({"lr_schedule": {**lr_schedule, "rounds": rounds}} if lr_schedule else {}),
    }


#: Flower's train_config keys (what its quickstart sends) -> the client spec's training fields
TRAIN_CONFIG_KEYS = {"lr": "lr", "local-epochs": "epochs", "batch-size": "batch_size"}


def for_run(
    fields: Mapping[str, Any], run: str, client_state_dir: str | None, server_store_dir: str | None
) -> dict[str, Any]:
    """A client spec from the fields a config resolves to (:func:`server_app.config.client_spec_fields`)
    and what only a started run knows: its token, the folder simulated clients keep their state in,
    the server store's folder."""
    out = copy.deepcopy(dict(fields))  # a plan's fields serve every spec made from it, unchanged
    out.update(run=run, client_state_dir=client_state_dir)
    out["server_store"] = {**dict(fields.get("server_store") or {}), "dir": server_store_dir}
    return out


def disagreements_with_spec(record: Mapping[str, Any], train: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of Flower's ``train_config`` that name a training setting of the client spec
    (``lr``, ``local-epochs``, ``batch-size``) with another value; any other key is the config's own."""
    return {
        key: value
        for key, value in record.items()
        if key in TRAIN_CONFIG_KEYS and train.get(TRAIN_CONFIG_KEYS[key]) != value
    }
