"""Resume: the strategy's checkpoint state, and the check that clients still hold theirs.

The base saves the last completed round, the global arrays, the round history, the run token, the
sampling RNG's state and torch's CPU RNG state, plus the method's state (the attributes its
``traits.state`` declares: :meth:`PersonalizedStrategy.method_state`). The file format is
:mod:`strategies.base.checkpoint`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import WARNING
from typing import Any, Protocol

import torch
from flwr.common import log

from .architectures import Architectures
from .client_directory import ClientInfo, ClientStateLost
from .round_log import id_list
from .run_context import RunContext


class Resumable(Protocol):
    """What resume reads from the strategy; each part restores its own state (load_state_dict)."""

    name: str
    model: Architectures
    run: RunContext

    def last_round(self) -> int: ...
    def method_state(self) -> dict[str, Any]: ...


def strategy_state(s: Resumable) -> dict[str, Any]:
    """Everything needed to continue the run after ``s.last_round()`` (live references:
    :func:`strategies.base.checkpoint.save_checkpoint` encodes them at once)."""
    archs = s.model.state()
    return {
        "method": s.name,
        "round": s.last_round(),
        "run_token": s.run.token,
        "global_arrays": archs.pop("global_arrays"),
        "history": s.run.history,
        "rng": s.run.rng.bit_generator.state,
        "torch_rng": torch.get_rng_state(),
        "extra": s.method_state(),
        **archs,
    }


def check_resumable(s: Resumable, state: Mapping[str, Any]) -> None:
    """Refuse a checkpoint of another method or another run (reads ``s``, changes nothing)."""
    if state["method"] != s.name:
        raise ValueError(f"the checkpoint is of method {state['method']!r}, this strategy is {s.name!r}")
    token = s.run.token
    if state["run_token"] != token:
        raise ValueError(
            f"the checkpoint belongs to run {state['run_token']!r}, this strategy to {token!r}: build it with "
            "the checkpoint's run token, or the clients will not find their personal state"
        )


def restored_history(state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The round history a checkpoint holds, checked against the round it says it ends at."""
    history = [dict(r) for r in state["history"]]
    last = int(history[-1]["round"]) if history else 0
    if last != int(state["round"]):
        raise ValueError(f"the checkpoint says round {state['round']} but its history ends at round {last}")
    return history


def trained_rounds(history: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """Client id -> the last round it trained in (from the round history)."""
    last: dict[int, int] = {}
    for record in history:
        for cid in record.get("clients", []):
            last[int(cid)] = int(record["round"])
    return last


def clients_without_state(history: Sequence[Mapping[str, Any]], clients: Mapping[int, ClientInfo]) -> list[int]:
    """Connected clients that trained before and hold no state saved after their last round: their
    personal tensors and BN statistics are gone (a new simulation without a client state directory,
    a SuperNode restarted without ``state-dir``)."""
    trained = trained_rounds(history)
    return [c for c in sorted(clients) if clients[c].state_round < trained.get(c, 0)]


def check_client_state(lost: list[int], resumed_after: int, state_dir: str | None, force: bool) -> list[int]:
    """At a resume: refuse (``ClientStateLost``) when clients lost their state, unless ``force``
    (config ``resume_force``); then returns them (the next round records them as ``client_state_lost``)."""
    if not lost:
        return []
    how = (
        f"the run keeps client state under {state_dir}; it holds none for these clients"
        if state_dir
        else "the run kept client state only in its processes' memory (client_state_dir: null)"
    )
    message = (
        f"cannot resume after round {resumed_after} exactly: client(s) {id_list(lost)} trained before and hold no "
        f"state for this run ({how}; a deployed SuperNode keeps it across restarts only with --node-config "
        "\"state-dir='<dir>'\"). Continuing would restart their personal layers and BN statistics and change the "
        "results. Start the run again, bring back the nodes with their state, or pass resume_force=true to go on "
        "anyway (the run is marked: client_state_lost in its metrics and summary)"
    )
    if not force:
        raise ClientStateLost(message)
    log(WARNING, "resume_force: %s", message)
    return lost
