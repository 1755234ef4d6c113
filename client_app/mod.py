"""``client_mod``: a Flower ClientApp of the user's own, unchanged, as a pflower client.

    from flwr.clientapp import ClientApp
    from pflower.client_app import client_mod

    app = ClientApp(mods=[client_mod(model=Net, data=data)])   # the app's own @app.train stays

Flower runs a mod in front of every function the ClientApp registers. Under a pflower strategy
this one answers the discovery query, builds the model the user's ``train`` receives (the
server's tensors and this client's personal ones, under the module's own state-dict names),
evaluates before and after it (``test_before``/``test_after``, on the test split ``data``
returns), keeps what the method keeps on the client, adds what the method needs from the
trained model (FedCMD's and FedCPMD's layer votes) and replies as the message contract says.
The user's ``train`` trains as it always did; its ``evaluate`` is not called: pflower evaluates
every method the same way (cross-entropy and accuracy on the client's test split), so results
compare across methods. A message from a strategy that is not pflower's passes through.

Only a method whose client trains one stage of plain training on the whole model can wrap a
training function it did not write; the others (FedProx's and Ditto's penalties, FedRep's two
stages, Felo's features, MOON's contrast...) are refused in one line naming
:func:`~pflower.client_app.build_clientapp`, which runs their own client side.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import torch
from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.clientapp.typing import Mod

from pflower.protocol import wire
from pflower.protocol.wire import TaskSpec

from .failures import one_line_failures
from .roles.base import FitPlan, stages
from .runtime import TrainTask, finish_train, handle_evaluate, handle_hello, start_train
from .user_parts import ClientHooks, DataFn, ModelFn

CallNext = Callable[[Message, Context], Message]


class ModError(ValueError):
    """A message or a reply client_mod cannot serve; the text names the fix."""

    user_error = True  # one `pflower:` line in Flower's log (pflower.logs)


def client_mod(
    model: ModelFn,
    data: DataFn,
    *,
    groups: Mapping[str, Sequence[str] | str] | None = None,
    num_classes: int | None = None,
) -> Mod:
    """A Flower mod that makes a ClientApp with its own ``@app.train`` a pflower client.

    ``model`` and ``data`` are what :func:`~pflower.client_app.build_clientapp` takes: the
    module's class or factory (built with the run's seed), and a function returning this client's
    ``(train, test)`` (datasets, DataLoaders or arrays; called with ``context``, ``client_id``
    and ``num_clients`` where it names them). ``data`` must hold what the app's ``train`` trains
    on: the mod checks the reply's ``num-examples`` against it."""
    if not callable(model) or not callable(data):
        raise TypeError("client_mod(model=..., data=...) takes two functions (or classes)")
    hooks = ClientHooks(model, data, groups, num_classes)

    def pflower_mod(message: Message, context: Context, call_next: CallNext) -> Message:
        spec = _spec_of(message)
        if spec is None:  # not a pflower strategy's message: the app's own function answers it
            return call_next(message, context)

        def serve(msg: Message, ctx: Context) -> Message:
            if spec.task == "query":  # discovery (sent as a train message where no query function is registered)
                return handle_hello(msg, ctx, hooks)
            if spec.task == "evaluate":
                return handle_evaluate(msg, ctx, hooks)
            return train_with_user_function(msg, ctx, hooks, call_next)

        # a failure (a method the mod cannot serve, the app's train function raising...) is one line
        # in the server's log, its traceback in a file on this machine (client_app.failures)
        return one_line_failures(serve)(message, context)

    return pflower_mod


def _spec_of(message: Message) -> TaskSpec | None:
    config = message.content.config_records.get(wire.CONFIG_RECORD) if message.has_content() else None
    if config is None or wire.SPEC_KEY not in config:
        return None
    return TaskSpec.from_json(str(config[wire.SPEC_KEY]))


def train_with_user_function(message: Message, context: Context, hooks: ClientHooks, call_next: CallNext) -> Message:
    """pflower's train step around the app's own training: prepare and evaluate as pflower's client
    does, hand the model to ``call_next`` (the app's ``train``), take its trained tensors back, run
    what the method adds after training, then evaluate, persist and reply."""
    task = start_train(message, context, hooks)
    job = task.job
    t0 = time.perf_counter()
    if not task.role.trains(job.model, job.ctx):  # a round without training (FedCPMD's vote-only probe)
        task.metrics.update(task.role.fit(job.model, job.data, task.args, job.ctx))
        return finish_train(task, context, time.perf_counter() - t0)
    plan = wrappable_stage(task)
    received = message.content
    message.content = user_content(message, job.model)
    try:
        reply = call_next(message, context)
    finally:
        message.content = received
    task.metrics.update(take_trained(reply, task))
    if plan.after is not None:
        task.metrics.update(plan.after(job.model))
    return finish_train(task, context, time.perf_counter() - t0)


def wrappable_stage(task: TrainTask) -> FitPlan:
    """The round's one plain stage (all parameters, cross-entropy, the received model), or a
    :class:`ModError` saying why the method's client must run its own training."""
    job = task.job
    if task.args.optimizer_state == "kept":
        raise ModError(
            "the strategy asks clients to keep their optimizer state between rounds (optimizer_state='kept'), "
            "which an app's own train function does not do: use optimizer_state='fresh' in client_spec, or "
            "pflower.client_app.build_clientapp(model=..., data=...)"
        )
    plan = task.role.plan(job.model, job.data, task.args, job.ctx)
    plans = stages(plan) if plan is not None else []
    plain = len(plans) == 1 and plans[0].params is None and plans[0].model is None and not plans[0].penalties()
    if not plain or plans[0].epochs is not None:
        timing = getattr(task.role.args, "selection_timing", None)
        hint = (
            " (FedCMD and FedCPMD work with it when they read the layer statistics after training: "
            "selection_timing='after_training' in the strategy)"
            if timing == "during_training"
            else ""
        )
        raise ModError(
            f"this method's client (role {task.role.name!r}) trains in its own way, which your ClientApp's train "
            f"function cannot do{hint}: build the ClientApp with pflower.client_app.build_clientapp(model=..., "
            "data=...) for this method"
        )
    return plans[0]


def user_content(message: Message, model: torch.nn.Module) -> RecordDict:
    """What the app's ``train`` gets: the same config (``lr``, ``local-epochs``, ...), and
    ``arrays`` holding the whole model (the server's tensors with this client's own) under the
    module's own state-dict names, as Flower's FedAvg would send them."""
    module = model.__dict__.get("wrapped", model)
    content = RecordDict({wire.CONFIG_RECORD: message.content.config_records[wire.CONFIG_RECORD]})
    content[wire.ARRAYS_RECORD] = ArrayRecord(module.state_dict())
    return content


def take_trained(reply: Message, task: TrainTask) -> dict[str, float]:
    """Load the app's trained tensors into the client's model; the reply's own scalar metrics
    (``train_loss``...) join pflower's. Refuses a reply that is an error, lacks the arrays, holds
    other tensors, or trained on another number of samples than ``data`` holds."""
    job = task.job
    if reply.has_error():
        raise ModError(f"your ClientApp's train function failed: {reply.error.reason}")
    records = reply.content.array_records
    if wire.ARRAYS_RECORD not in records and len(records) != 1:
        raise ModError(
            f"your train function's reply has array records {sorted(records)}; reply with "
            "RecordDict({'arrays': ArrayRecord(model.state_dict()), 'metrics': ...}) as Flower's quickstart does"
        )
    arrays = records.get(wire.ARRAYS_RECORD) or next(iter(records.values()))
    module = job.model.__dict__.get("wrapped", job.model)
    state = arrays.to_torch_state_dict()
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModError(f"your train function's reply does not fit the model client_mod builds: {exc}") from exc
    metrics = next(iter(reply.content.metric_records.values()), None)
    out = {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, (int, float)) and k != wire.NUM_EXAMPLES}
    trained = int(metrics[wire.NUM_EXAMPLES]) if metrics is not None and wire.NUM_EXAMPLES in metrics else None
    if trained is not None and trained != job.data.num_train:
        raise ModError(
            f"your train function trained on {trained} samples, but client_mod's data function gives client "
            f"{job.client_id} {job.data.num_train}: give client_mod(data=...) the data your train function reads"
        )
    out.setdefault("train_loss", 0.0)
    return {k: v for k, v in out.items() if k not in task.metrics}


__all__ = ["ModError", "client_mod"]
