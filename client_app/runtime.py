"""What a ClientApp does with each message, as plain functions of (message, context).

Train: rebuild the model, load the client's persisted personal tensors, overlay what the
server sent, evaluate (``test_before``), run the method's role, evaluate again
(``test_after``), persist the personal tensors, reply with the groups the server asked for.
"""

from __future__ import annotations

import copy
import json
import time
import zlib
from functools import lru_cache
from logging import DEBUG, INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.common import log

from models import LayeredNet, buffer_keys, build_model, trainable_keys

from .data import ClientData, DataSpec, load_client_data
from .data.local import with_node_data_dir
from .roles import RoleContext, build_role
from .roles.base import EXTRA_PREFIX
from .state import ClientState
from .training import TrainArgs, evaluate, pick_device

# Test hook (tests/e2e only, never set it on a real device): node config ``test-fault`` makes
# this node tamper with its train replies so the server's validation can be tested on real
# processes. Values: ``nan`` (NaN weights), ``shape`` (a wrong tensor shape), ``count`` (a
# forged num-examples), or a comma list cycled over the rounds ("shape,nan,count").
TEST_FAULT_KEY = "test-fault"


def client_id_of(context: Context) -> int:
    """The stable client id: ``client-id`` in deployment, ``partition-id`` in simulation."""
    config = context.node_config
    for key in ("client-id", "partition-id"):
        if key in config:
            return int(config[key])
    raise ValueError("this SuperNode has no client id: start it with --node-config \"client-id=<N>\"")


def parse_spec(message: Message) -> dict[str, Any]:
    config = message.content.config_records.get("config")
    if config is None or "spec" not in config:
        raise ValueError("message carries no pflower spec: is the ServerApp a pflower ServerApp?")
    return json.loads(str(config["spec"]))


def client_data(spec: dict[str, Any], client_id: int, node_config: dict[str, Any] | None = None) -> ClientData:
    """The client's tensors: its partition, or with ``dataset=local`` its node's ``data-dir``."""
    return load_client_data(DataSpec.from_dict(with_node_data_dir(spec["data"], node_config or {})), client_id)


@lru_cache(maxsize=8)
def _initial_model(name: str, kwargs_json: str, in_shape: tuple[int, int, int], num_classes: int, seed: int) -> LayeredNet:
    return build_model(name, in_shape, num_classes, seed=seed, **json.loads(kwargs_json))


def fresh_model(spec: dict[str, Any]) -> LayeredNet:
    """The run's initial model (same seed as the server's), copied from a per-process cache."""
    info = DataSpec.from_dict(spec["data"]).info
    model_spec = spec["model"]
    kwargs = {k: v for k, v in model_spec.items() if k != "name"}
    base = _initial_model(model_spec["name"], json.dumps(kwargs, sort_keys=True), info.in_shape, info.num_classes, int(spec["seed"]))
    return copy.deepcopy(base)


def _metrics_reply(message: Message, metrics: dict[str, float], arrays: ArrayRecord | None = None) -> Message:
    content = RecordDict({"metrics": MetricRecord(metrics)})
    if arrays is not None:
        content["arrays"] = arrays
    return Message(content=content, reply_to=message)


def handle_hello(message: Message, context: Context) -> Message:
    """Discovery: tell the server who this client is and how much data it holds."""
    spec = parse_spec(message)
    cid = client_id_of(context)
    data = client_data(spec, cid, context.node_config)
    metrics = {"client-id": cid, "num-train": data.num_train, "num-test": data.num_test}
    if "num-partitions" in context.node_config:  # simulation: lets the server check the node count
        metrics["num-partitions"] = int(context.node_config["num-partitions"])
    return _metrics_reply(message, metrics)


def _prepare(
    message: Message, context: Context
) -> tuple[dict[str, Any], int, ClientData, LayeredNet, ClientState, RoleContext, int]:
    spec = parse_spec(message)
    config = message.content.config_records["config"]
    cid = client_id_of(context)
    if int(config["client-id"]) != cid:
        raise ValueError(f"message addressed to client {config['client-id']} reached client {cid}")
    data = client_data(spec, cid, context.node_config)
    device = pick_device(spec.get("device", "auto"))
    model = fresh_model(spec)
    state_dir = context.node_config.get("state-dir") or spec.get("client_state_dir")
    state = ClientState(context, cid, spec["run"], state_dir, versions=int(spec.get("state_versions", 1)))
    server_round = int(config["server-round"])
    # training round r starts from the state saved before r (a replayed round after a server crash
    # sees what it saw the first time); the evaluation after round r uses round r's
    saved = state.load(before_round=server_round + (spec.get("task") == "evaluate"))
    extra = {k[len("extra."):]: v for k, v in saved.items() if k.startswith("extra.")}
    own = {k: v for k, v in saved.items() if not k.startswith("extra.")}
    model.load_state_dict(own, strict=False)
    record = message.content.array_records.get("arrays", ArrayRecord())
    received = {k: torch.from_numpy(v.numpy().copy()) for k, v in record.items()}
    received_extra = {k[len(EXTRA_PREFIX):]: received.pop(k) for k in list(received) if k.startswith(EXTRA_PREFIX)}
    known = set(model.state_dict())
    unknown = [k for k in received if k not in known]
    if unknown:
        raise ValueError(f"server sent tensors this model does not have: {unknown[:5]}")
    model.load_state_dict(received, strict=False)
    model.to(device)
    seed = zlib.crc32(f"{spec['seed']}-{cid}-{server_round}".encode())
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout masks
    personal, personal_keys = list(spec.get("personal", [])), list(spec.get("personal_keys", []))
    ctx = RoleContext(device, generator, server_round, personal, extra, personal_keys, received_extra=received_extra)
    return spec, cid, data, model, state, ctx, len(saved)


def _train_args(spec: dict[str, Any]) -> TrainArgs:
    return TrainArgs(**spec["train"])


def _eval_metrics(prefix: str, result: tuple[int, float, int]) -> dict[str, float]:
    correct, loss_sum, _ = result
    return {f"{prefix}_correct": correct, f"{prefix}_loss_sum": loss_sum}


def handle_train(message: Message, context: Context) -> Message:
    spec, cid, data, model, state, ctx, restored = _prepare(message, context)
    args = _train_args(spec)
    role = build_role(spec["role"], spec.get("role_args", {}))
    metrics: dict[str, float] = {"client-id": cid, "num-examples": data.num_train, "test_size": data.num_test}
    t0 = time.perf_counter()
    metrics.update(_eval_metrics("test_before", evaluate(role.eval_model(model, data, args, ctx), data.x_test, data.y_test, device=ctx.device)))
    t1 = time.perf_counter()
    metrics.update(role.fit(model, data, args, ctx))
    t2 = time.perf_counter()
    after = role.trained_model(model, ctx)  # the trained model (Ditto: the personal one)
    metrics.update(_eval_metrics("test_after", evaluate(after, data.x_test, data.y_test, device=ctx.device)))
    metrics.update({"eval_time_s": (t1 - t0) + (time.perf_counter() - t2), "train_time_s": t2 - t1})
    _persist(model, state, ctx)
    stay = set(ctx.personal_keys)
    upload = [k for k in trainable_keys(model, spec.get("upload", [])) if k not in stay]
    sd = model.state_dict()
    tensors = {k: sd[k].detach().cpu().numpy() for k in upload}
    tensors.update({EXTRA_PREFIX + k: v.detach().cpu().numpy() for k, v in ctx.upload_extra.items()})
    log(
        INFO if "partition-id" not in context.node_config else DEBUG,  # one line per round on a device, quiet in simulation
        "client %d round %d: test_before %.4f test_after %.4f (%d test samples), %d state tensors restored",
        cid, ctx.server_round, metrics["test_before_correct"] / max(data.num_test, 1),
        metrics["test_after_correct"] / max(data.num_test, 1), data.num_test, restored,
    )
    if TEST_FAULT_KEY in context.node_config:
        _tamper(str(context.node_config[TEST_FAULT_KEY]), ctx.server_round, metrics, tensors)
    arrays = ArrayRecord(array_dict={k: Array(v) for k, v in tensors.items()})
    return _metrics_reply(message, metrics, arrays)


def _tamper(fault: str, server_round: int, metrics: dict[str, float], tensors: dict[str, np.ndarray]) -> None:
    """Test hook (``test-fault`` node config): make this reply one the server must reject."""
    kinds = [k.strip() for k in fault.split(",") if k.strip()] or ["none"]
    kind = kinds[(server_round - 1) % len(kinds)]
    key = next(iter(tensors), None)
    if kind == "nan" and key is not None:
        tensors[key] = np.full_like(tensors[key], np.nan)
    elif kind == "shape" and key is not None:
        tensors[key] = np.zeros((*tensors[key].shape[:-1], tensors[key].shape[-1] + 1), tensors[key].dtype)
    elif kind == "count":
        metrics["num-examples"] = metrics["num-examples"] * 10 + 7
    elif kind != "none":
        raise ValueError(f"unknown {TEST_FAULT_KEY} {kind!r}: use nan, shape, count or none")
    log(WARNING, "%s: round %d reply tampered with (%s) on purpose", TEST_FAULT_KEY, server_round, kind)


def handle_evaluate(message: Message, context: Context) -> Message:
    spec, cid, data, model, _, ctx, _ = _prepare(message, context)
    role = build_role(spec["role"], spec.get("role_args", {}))
    result = evaluate(role.eval_model(model, data, _train_args(spec), ctx), data.x_test, data.y_test, device=ctx.device)
    metrics = {"client-id": cid, "num-examples": data.num_train, "test_size": data.num_test, **_eval_metrics("test", result)}
    return _metrics_reply(message, metrics)


def _persist(model: LayeredNet, state: ClientState, ctx: RoleContext) -> None:
    """Keep personal groups and keys, BN buffers and the role's extra tensors for the next round."""
    sd = model.state_dict()
    keep = set(trainable_keys(model, ctx.personal)) | set(ctx.personal_keys) | set(buffer_keys(model))
    tensors = {k: sd[k] for k in sd if k in keep}
    tensors.update({f"extra.{k}": v for k, v in ctx.extra_state.items()})
    state.save(tensors, ctx.server_round)
