"""What a ClientApp does with each message, as plain functions of (message, context).

Train: rebuild the model, load the client's persisted tensors, overlay what the server sent,
evaluate (``test_before``), run the method's role, evaluate again (``test_after``), persist
(the personal tensors, or the whole model when the strategy asks the client to keep it),
reply with the tensors the server asked for (or the subset the role chose from the declared
upload sets).
"""

from __future__ import annotations

import copy
import json
import time
import zlib
from dataclasses import dataclass
from functools import lru_cache
from logging import DEBUG, INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.common import log
from torch import nn

from pflower.federated_data import ClientData, DataSpec, load_client_data, load_public_data, load_transfer_data
from pflower.federated_data.local import with_node_data_dir
from pflower.federated_data.node_cache import cache_dir, load_or_build
from pflower.models import LayeredNet, buffer_keys, build_model, trainable_keys
from pflower.models.schema import float_buffer_keys
from pflower.protocol import wire
from pflower.protocol.wire import STATE_EXTRA_PREFIX, WIRE_EXTRA_PREFIX, SpecError, TaskSpec

from .node import (
    apply_threads,
    cold_start_s,
    deterministic_mode,
    forked_from_fork_server,
    is_deployed,
    node_device,
    warm_up,
)
from .roles import Role, RoleContext, build_role
from .state import ClientState
from .training import TrainArgs, evaluate, pick_device
from .user_parts import ClientHooks

# Test hook (tests/e2e only, never set it on a real device): node config ``test-fault`` makes
# this node tamper with its train replies so the server's validation can be tested on real
# processes. Values: ``nan`` (NaN weights), ``shape`` (a wrong tensor shape), ``count`` (a
# forged num-examples), ``slow:<seconds>`` (a valid reply, sent that many seconds late: past
# the round's timeout it is a late reply the server must refuse), or a comma list cycled over
# the rounds ("shape,nan,count").
TEST_FAULT_KEY = "test-fault"


def client_id_of(context: Context) -> int:
    """The stable client id: ``client-id`` in deployment, ``partition-id`` in simulation."""
    config = context.node_config
    for key in (wire.NODE_CLIENT_ID, wire.NODE_PARTITION_ID):
        if key in config:
            return int(config[key])
    raise ValueError('this SuperNode has no client id: start it with --node-config "client-id=<N>"')


def parse_spec(message: Message) -> TaskSpec:
    config = message.content.config_records.get(wire.CONFIG_RECORD)
    if config is None or wire.SPEC_KEY not in config:
        raise SpecError("message carries no pflower spec: is the ServerApp a pflower ServerApp?")
    return TaskSpec.from_json(str(config[wire.SPEC_KEY]))


def computes_on_cuda(run_device: str, node_config: dict[str, Any] | None = None) -> bool:
    """Whether a node's client computes on CUDA: the node config's ``device`` when set, else the
    run's (``auto``: CUDA when present). A device this machine lacks counts as not CUDA here: the
    handler refuses it with the fix. (Asks torch about the GPU: a process that forks workers
    after asking must not give them CUDA work, see ``simulation/parallel.py``.)"""
    try:
        return pick_device(node_device(node_config or {}, run_device)).type == "cuda"
    except (ValueError, RuntimeError):
        return False


def client_data(
    spec: TaskSpec | dict[str, Any], client_id: int, node_config: dict[str, Any] | None = None
) -> ClientData:
    """The client's tensors: its partition, or with ``dataset=local`` its node's ``data-dir``.
    A deployed node keeps its partition in its disk cache (``federated_data.node_cache``)."""
    node_config = node_config or {}
    data = spec.data if isinstance(spec, TaskSpec) else spec["data"]
    data_spec = DataSpec.from_dict(with_node_data_dir(data, node_config))
    root = cache_dir(node_config) if is_deployed(node_config) and not data_spec.info.node_local else None
    if root is None:
        return load_client_data(data_spec, client_id)
    return _node_cached_data(data_spec, client_id, root)


@lru_cache(maxsize=8)
def _node_cached_data(data_spec: DataSpec, client_id: int, root: Any) -> ClientData:
    data, _ = load_or_build(root, data_spec.to_dict(), client_id, lambda: load_client_data(data_spec, client_id))
    return data


@lru_cache(maxsize=8)
def _initial_model(
    name: str, kwargs_json: str, in_shape: tuple[int, int, int], num_classes: int, seed: int
) -> LayeredNet:
    return build_model(name, in_shape, num_classes, seed=seed, **json.loads(kwargs_json))


def fresh_model(spec: TaskSpec | dict[str, Any]) -> LayeredNet:
    """The run's initial model of this client's architecture (same seed as the server's), copied
    from a per-process cache."""
    data, model_spec, seed = (
        (spec.data, spec.model, spec.seed)
        if isinstance(spec, TaskSpec)
        else (spec["data"], spec["model"], spec["seed"])
    )
    info = DataSpec.from_dict(data).info
    kwargs = {k: v for k, v in model_spec.items() if k != "name"}
    # no sort_keys: the order of a mapping option is meaningful (model.groups lists groups in forward order)
    base = _initial_model(model_spec["name"], json.dumps(kwargs), info.in_shape, info.num_classes, int(seed))
    return copy.deepcopy(base)


def _metrics_reply(
    message: Message, metrics: dict[str, float], arrays: ArrayRecord | None = None, hello: dict | None = None
) -> Message:
    content = RecordDict({wire.METRICS_RECORD: MetricRecord(metrics)})
    if arrays is not None:
        content[wire.ARRAYS_RECORD] = arrays
    if hello:
        content[wire.HELLO_RECORD] = ConfigRecord(hello)
    return Message(content=content, reply_to=message)


def handle_hello(message: Message, context: Context, hooks: ClientHooks | None = None) -> Message:
    """Discovery: tell the server who this client is, how much data it holds and (if its node
    config names one) which architecture it runs."""
    spec = parse_spec(message)
    cid = client_id_of(context)
    data = hooks.data_of(context, cid) if hooks else client_data(spec, cid, context.node_config)
    state = ClientState(context, cid, spec.run, state_dir_of(spec, context.node_config))
    metrics = {
        wire.CLIENT_KEY: cid,
        wire.NUM_TRAIN: data.num_train,
        wire.NUM_TEST: data.num_test,
        wire.STATE_ROUND: state.newest_round(),
    }
    if wire.NUM_PARTITIONS in context.node_config:  # simulation: lets the server check the node count
        metrics[wire.NUM_PARTITIONS] = int(context.node_config[wire.NUM_PARTITIONS])
    hello: dict[str, str] = {}
    announced = context.node_config.get(wire.NODE_MODEL)
    if announced:
        hello[wire.NODE_MODEL] = str(announced)
    origin = data_origin(data)
    if origin is not None:
        hello[wire.DATA_ORIGIN] = json.dumps(origin, sort_keys=True)
    return _metrics_reply(message, metrics, hello=hello or None)


def state_dir_of(spec: TaskSpec, node_config: dict[str, Any]) -> str | None:
    """Where this client's state file lives: its node's ``state-dir``; in simulation the run's
    ``client_state_dir`` (a path on the server's machine, so a deployed node never uses it)."""
    own = node_config.get(wire.NODE_STATE_DIR)
    if own:
        return str(own)
    return None if is_deployed(node_config) else spec.client_state_dir


def data_origin(data: ClientData) -> dict[str, Any] | None:
    """What a node's own data directory says it holds (meta.json: its dataset name and, for a
    directory written by ``scripts/export_partitions.py``, the partition it was cut from)."""
    meta = (data.extra or {}).get("meta")
    if not isinstance(meta, dict):
        return None
    origin: dict[str, Any] = {"name": meta.get("name")}
    if isinstance(meta.get("exported_from"), dict):
        origin["exported_from"] = meta["exported_from"]
    return origin


@dataclass
class Job:
    """One train/evaluate message, made ready: the spec, the client's data and its model with
    its persisted tensors and the server's tensors loaded, and the role's context."""

    spec: TaskSpec
    client_id: int
    data: ClientData
    model: LayeredNet
    state: ClientState
    ctx: RoleContext
    restored: int  # tensors loaded from the client's state
    timings: dict[str, float]  # cold_start_s (a fresh process), setup_time_s, device_setup_s (first CUDA use)


def prepare(message: Message, context: Context, hooks: ClientHooks | None = None) -> Job:
    timings: dict[str, float] = {}
    cold = cold_start_s() if is_deployed(context.node_config) else None  # a simulation process lives for the run
    if cold is not None:
        timings["cold_start_s"] = cold
    t0 = time.perf_counter()
    apply_threads(context.node_config)
    spec = parse_spec(message)
    config = message.content.config_records[wire.CONFIG_RECORD]
    cid = client_id_of(context)
    if int(config[wire.CLIENT_KEY]) != cid:
        raise ValueError(f"message addressed to client {config[wire.CLIENT_KEY]} reached client {cid}")
    node_model = context.node_config.get(wire.NODE_MODEL)
    if node_model and spec.arch and str(node_model) != spec.arch:
        raise ValueError(
            f"the server sent a {spec.arch} model spec, but this node runs {node_model!r} (node config model)"
        )
    data = hooks.data_of(context, cid) if hooks else client_data(spec, cid, context.node_config)
    device = pick_device(node_device(context.node_config, spec.device))
    if spec.deterministic:
        deterministic_mode()
    model = hooks.model_of(spec, tuple(data.x_train.shape[1:])) if hooks else fresh_model(spec)
    state = ClientState(context, cid, spec.run, state_dir_of(spec, context.node_config), versions=spec.state_versions)
    server_round = int(config[wire.ROUND_KEY])
    # training round r starts from the state saved before r (a replayed round after a server crash
    # sees what it saw the first time); the evaluation after round r uses round r's
    saved = state.load(before_round=server_round + (spec.task == "evaluate"))
    extra = {k[len(STATE_EXTRA_PREFIX) :]: v for k, v in saved.items() if k.startswith(STATE_EXTRA_PREFIX)}
    own = {k: v for k, v in saved.items() if not k.startswith(STATE_EXTRA_PREFIX)}
    model.load_state_dict(own, strict=False)
    record = message.content.array_records.get(wire.ARRAYS_RECORD, ArrayRecord())
    received = {k: torch.from_numpy(v.numpy().copy()) for k, v in record.items()}
    received_extra = {
        k[len(WIRE_EXTRA_PREFIX) :]: received.pop(k) for k in list(received) if k.startswith(WIRE_EXTRA_PREFIX)
    }
    known = set(model.state_dict())
    unknown = [k for k in received if k not in known]
    if unknown:
        raise ValueError(f"server sent tensors this model does not have: {unknown[:5]}")
    model.load_state_dict(received, strict=False)
    warmed = warm_up(model, tuple(data.x_train.shape[1:]), device)  # before the seeding below
    if warmed is not None:
        timings["device_setup_s"] = warmed
    model.to(device)
    seed = zlib.crc32(f"{spec.seed}-{cid}-{server_round}".encode())
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout masks
    ctx = RoleContext(
        device,
        generator,
        server_round,
        list(spec.personal),
        extra,
        list(spec.personal_keys),
        received_extra=received_extra,
        upload_keys=upload_keys(model, spec),
    )
    data_spec = DataSpec.from_dict(spec.data)
    if data_spec.transfer_fraction > 0 and not data_spec.info.node_local:
        ctx.transfer = load_transfer_data(data_spec)
    timings["setup_time_s"] = time.perf_counter() - t0 - timings.get("device_setup_s", 0.0)
    return Job(spec, cid, data, model, state, ctx, len(saved), timings)


def upload_keys(model: LayeredNet, spec: TaskSpec) -> list[str]:
    """The most a train reply sends: the upload groups' trainable keys (and float buffers with
    ``shared_buffers``), minus the personal keys, in state-dict order."""
    if spec.task != "train":
        return []
    keys = set(trainable_keys(model, spec.upload))
    if spec.shared_buffers:
        groups = set(spec.upload)
        keys |= {k for k in float_buffer_keys(model) if k.split(".")[1] in groups}
    stay = set(spec.personal_keys)
    return [k for k in model.state_dict() if k in keys and k not in stay]


def _train_args(spec: TaskSpec) -> TrainArgs:
    unknown, _ = wire.unknown_fields(TrainArgs, spec.train)
    if unknown:  # e.g. optimizer_state from a newer ServerApp: refuse, naming the fix
        raise SpecError(
            f"the server's message has training setting(s) {unknown} this ClientApp does not know: "
            "the SuperNode runs an older pflower than the ServerApp (update pflower on the node)"
        )
    return TrainArgs(**spec.train)


def _eval_metrics(prefix: str, result: tuple[int, float, int]) -> dict[str, float]:
    correct, loss_sum, _ = result
    return {f"{prefix}_correct": correct, f"{prefix}_loss_sum": loss_sum}


Evaluation = tuple[int, float, int]  # (correct, summed loss, samples): what evaluate() returns


@dataclass
class TrainTask:
    """A train message between its evaluation before training and its training: the prepared
    :class:`Job`, the role, the metrics so far and the seconds spent evaluating; ``batched``:
    trained inside a group by the batched engine; ``before``: the model ``test_before`` is still
    to evaluate (an engine that evaluates many clients at once: :func:`record_before`)."""

    message: Message
    job: Job
    role: Role
    args: TrainArgs
    metrics: dict[str, float]
    eval_s: float
    batched: bool = False
    before: nn.Module | None = None
    # the global random state this client's preparation left (dropout masks draw from it): an
    # engine that prepares several clients before training one restores it first (:func:`resume_random`)
    random_state: tuple[torch.Tensor, torch.Tensor | None] | None = None


def start_train(
    message: Message, context: Context, hooks: ClientHooks | None = None, *, deferred: bool = False
) -> TrainTask:
    """Prepare a train message and evaluate the received model (``test_before``). ``deferred``:
    the engine prepares a chunk of clients before training any (the batched engine), so the
    model to evaluate is left in ``task.before`` and the random state this preparation left is
    kept for :func:`resume_random`."""
    job = prepare(message, context, hooks)
    spec, cid, data, model, ctx = job.spec, job.client_id, job.data, job.model, job.ctx
    args = _train_args(spec)
    role = build_role(spec.role, spec.role_args)
    metrics: dict[str, float] = {wire.CLIENT_KEY: cid, wire.NUM_EXAMPLES: data.num_train, wire.TEST_SIZE: data.num_test}
    t0 = time.perf_counter()
    task = TrainTask(message, job, role, args, metrics, 0.0, before=role.eval_model(model, data, args, ctx))
    if not deferred:
        record_before(task, evaluate(task.before, data.x_test, data.y_test, device=ctx.device))
    task.eval_s += time.perf_counter() - t0
    if deferred:
        cuda = torch.cuda.get_rng_state(ctx.device) if ctx.device.type == "cuda" else None
        task.random_state = (torch.get_rng_state(), cuda)
    return task


def resume_random(task: TrainTask) -> None:
    """Put back the global random state ``task``'s preparation left, so that its training draws
    the masks it draws when it trains right after its own preparation (the serial engine)."""
    if task.random_state is not None:
        cpu, cuda = task.random_state
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, task.job.ctx.device)


def record_before(task: TrainTask, result: Evaluation) -> None:
    """``test_before``'s numbers, from the evaluation of ``task.before``."""
    task.metrics.update(_eval_metrics("test_before", result))
    task.before = None


def handle_train(message: Message, context: Context, hooks: ClientHooks | None = None) -> Message:
    """A train message: discovery where its spec's task is ``query`` (the server asks that way
    first, see ``ClientDirectory.query``), else a round of local training."""
    if parse_spec(message).task == "query":
        return handle_hello(message, context, hooks)
    task = start_train(message, context, hooks)
    job = task.job
    t1 = time.perf_counter()
    task.metrics.update(task.role.fit(job.model, job.data, task.args, job.ctx))
    return finish_train(task, context, time.perf_counter() - t1)


def finish_train(task: TrainTask, context: Context, train_s: float, after: Evaluation | None = None) -> Message:
    """After training: evaluate (``test_after``; ``after``: its numbers where the engine already
    evaluated ``role.trained_model``), persist what the client keeps, and reply."""
    job, metrics = task.job, task.metrics
    spec, cid, data, model, ctx = job.spec, job.client_id, job.data, job.model, job.ctx
    t2 = time.perf_counter()
    if after is None:  # the trained model (Ditto: the personal one)
        after = evaluate(task.role.trained_model(model, ctx), data.x_test, data.y_test, device=ctx.device)
    metrics.update(_eval_metrics("test_after", after))
    metrics.update({"eval_time_s": task.eval_s + (time.perf_counter() - t2), "train_time_s": train_s, **job.timings})
    persist(model, job.state, ctx, spec.keep)
    allowed = set(upload_keys(model, spec))
    chosen = [k for k in ctx.upload_keys if k in allowed]
    if len(chosen) != len(ctx.upload_keys):
        raise ValueError(
            f"role {spec.role} chose to upload {sorted(set(ctx.upload_keys) - allowed)[:5]}, which the server did not "
            "ask for"
        )
    sd = model.state_dict()
    tensors = {k: sd[k].detach().cpu().numpy() for k in chosen}
    tensors.update({WIRE_EXTRA_PREFIX + k: v.detach().cpu().numpy() for k, v in ctx.upload_extra.items()})
    log(
        INFO
        if wire.NODE_PARTITION_ID not in context.node_config
        else DEBUG,  # one line per round on a device, quiet in simulation
        "client %d round %d: test_before %.4f test_after %.4f (%d test samples), %d state tensors restored; %s",
        cid,
        ctx.server_round,
        metrics["test_before_correct"] / max(data.num_test, 1),
        metrics["test_after_correct"] / max(data.num_test, 1),
        data.num_test,
        job.restored,
        _timing_text(metrics),
    )
    if TEST_FAULT_KEY in context.node_config:
        _tamper(str(context.node_config[TEST_FAULT_KEY]), ctx.server_round, metrics, tensors)
    arrays = ArrayRecord(array_dict={k: Array(v) for k, v in tensors.items()})
    return _metrics_reply(task.message, metrics, arrays)


def _timing_text(metrics: dict[str, float]) -> str:
    """The round's seconds on this node, e.g. 'cold start 3.41 s, setup 0.05 s, train 0.31 s, eval 0.04 s'."""
    parts = [
        (name, metrics[key])
        for name, key in (
            ("cold start", "cold_start_s"),
            ("device setup", "device_setup_s"),
            ("setup", "setup_time_s"),
            ("train", "train_time_s"),
            ("eval", "eval_time_s"),
        )
        if key in metrics
    ]
    text = ", ".join(f"{name} {value:.2f} s" for name, value in parts)
    if "cold_start_s" in metrics and forked_from_fork_server():
        text += " (a fork of pflower-superexec's fork server: torch was imported before it)"
    return text


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
    elif kind.startswith("slow:"):
        seconds = float(kind.split(":", 1)[1])
        log(WARNING, "%s: round %d reply held back %.1f s on purpose", TEST_FAULT_KEY, server_round, seconds)
        time.sleep(seconds)
        return
    elif kind != "none":
        raise ValueError(f"unknown {TEST_FAULT_KEY} {kind!r}: use nan, shape, count, slow:<seconds> or none")
    log(WARNING, "%s: round %d reply tampered with (%s) on purpose", TEST_FAULT_KEY, server_round, kind)


def handle_evaluate(message: Message, context: Context, hooks: ClientHooks | None = None) -> Message:
    job = prepare(message, context, hooks)
    role = build_role(job.spec.role, job.spec.role_args)
    eval_model = role.eval_model(job.model, job.data, _train_args(job.spec), job.ctx)
    result = evaluate(eval_model, job.data.x_test, job.data.y_test, device=job.ctx.device)
    metrics = {
        wire.CLIENT_KEY: job.client_id,
        wire.NUM_EXAMPLES: job.data.num_train,
        wire.TEST_SIZE: job.data.num_test,
        **_eval_metrics("test", result),
    }
    if job.spec.global_test:
        if hooks:
            raise ValueError(
                "the server asked for an evaluation on its dataset's global test set, which a ClientApp with its own "
                "data (build_clientapp) does not have: use a method that evaluates on the clients' own test splits"
            )
        images, labels = global_test_set(job.spec, context.node_config)
        metrics.update(_eval_metrics("global", evaluate(eval_model, images, labels, device=job.ctx.device)))
        metrics[wire.GLOBAL_TEST_SIZE] = len(labels)
    return _metrics_reply(message, metrics)


def global_test_set(spec: TaskSpec, node_config: dict[str, Any]) -> tuple[Any, Any]:
    """The dataset's labelled public split (``dataset.public=test|holdout``) as this client's data
    spec describes it: the same images the server would use, read from the shared dataset."""
    data_spec = DataSpec.from_dict(with_node_data_dir(spec.data, node_config))
    if data_spec.public == "none" or data_spec.info.node_local:
        raise ValueError(
            "the server asked for an evaluation on the global test set, but this client's data has no public split "
            "(it needs dataset.public=test|holdout and a dataset every client reads, not dataset=local)"
        )
    return load_public_data(data_spec)


def persist(model: LayeredNet, state: ClientState, ctx: RoleContext, keep: str = "personal") -> None:
    """Save what the client keeps for its next round: ``personal`` = its personal groups and
    keys and the BN buffers; ``model`` = every tensor of the model; ``none`` = none of them. The
    role's extra tensors (``ctx.extra_state``) are always kept."""
    sd = model.state_dict()
    if keep == "model":
        tensors = dict(sd)
    elif keep == "none":
        tensors = {}
    else:
        keep_keys = set(trainable_keys(model, ctx.personal)) | set(ctx.personal_keys) | set(buffer_keys(model))
        tensors = {k: sd[k] for k in sd if k in keep_keys}
    tensors.update({f"{STATE_EXTRA_PREFIX}{k}": v for k, v in ctx.extra_state.items()})
    state.save(tensors, ctx.server_round)
