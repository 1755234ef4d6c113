"""Many clients' local training as one computation: the batched engine's arithmetic.

The clients of one group share an architecture, a :class:`~client_app.roles.base.FitPlan` shape
(which parameters train, which penalty) and the round's :class:`~client_app.training.TrainArgs`.
Their parameters, BatchNorm buffers and momentum buffers are stacked along a new first
dimension, and each step runs every active client's forward and backward at once through
``torch.func.vmap`` over ``torch.func.functional_call`` of one template module.

What stays as in :func:`client_app.training.train`, client by client: the batch order (each
client's own :func:`~client_app.training.batch_indices` from its own generator), the loss (the
mean cross-entropy of its batch plus the plan's penalty), the update (``PlainSGD``'s arithmetic:
weight decay added to the gradient, momentum buffer started from the first step's direction),
the BatchNorm statistics (each client's from its own batch) and the returned mean batch loss.
What differs: clients of unequal size run unequal step counts, so at a step only the clients
with a batch left take part, grouped by batch size (the last batch of an epoch is smaller);
and float sums are taken in another order, so the result equals the one-at-a-time engines' to
a tolerance, not bit for bit (tests/pinned/test_batched_engine.py states it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap

from pflower.models.optim import sgd_update

from .roles.base import FitPlan, Plans, Role, finish_stages, stages, train_stage
from .runtime import TrainTask, resume_random
from .training import TrainArgs, batch_indices, evaluate

Say = Callable[[str, str], None]  # (role, why it trains one client at a time): the engine logs it once


def train_tasks(tasks: Sequence[TrainTask], say: Say) -> list[float | Exception]:
    """Train every task's client (each already prepared and evaluated: ``runtime.start_train``):
    those whose role describes this round's training as :class:`FitPlan` stages in groups that
    train as one computation (:func:`group_key`), stage by stage, the rest one at a time with
    their role's ``fit``. Each task's training seconds (a group's wall shared equally), or the
    exception its training raised; its metrics get the stages' losses
    (:func:`~client_app.roles.base.stage_metrics`) and the plans' ``after`` metrics."""
    out: list[float | Exception | None] = [None] * len(tasks)
    plans: list[list[FitPlan] | None] = []
    for i, task in enumerate(tasks):
        try:
            plan = plan_of(task, say)
            plans.append(None if plan is None else stages(plan))
        except Exception as exc:  # noqa: BLE001 - this client's error reply, not the round's end
            plans.append(None)
            out[i] = exc
    losses: dict[int, list[float]] = {i: [] for i, p in enumerate(plans) if p is not None}
    seconds = dict.fromkeys(losses, 0.0)
    for stage in range(max((len(p) for p in plans if p is not None), default=0)):
        groups: dict[Any, list[int]] = {}
        for i in losses:
            if len(losses[i]) == stage < len(plans[i]):  # type: ignore[arg-type]  (not yet trained alone)
                groups.setdefault(group_key(tasks[i], plans[i][stage]), []).append(i)  # type: ignore[index]
        for members in groups.values():
            steps = [plans[i][stage] for i in members]  # type: ignore[index]
            first = tasks[members[0]]
            t0 = time.perf_counter()
            drawn = [tasks[i].job.ctx.generator.get_state() for i in members]  # batch orders not yet drawn
            try:
                trained = train_together(
                    [tasks[i].job.model if step.model is None else step.model for i, step in zip(members, steps)],
                    [(tasks[i].job.data.x_train, tasks[i].job.data.y_train) for i in members],
                    steps,
                    steps[0].train_args(first.args),
                    [tasks[i].job.ctx.generator for i in members],
                    first.job.ctx.device,
                )
            except NotBatchable as exc:
                say(first.role.name, str(exc))
                for i, state in zip(members, drawn):  # this stage on: one at a time (models untouched)
                    job, t0 = tasks[i].job, time.perf_counter()
                    job.ctx.generator.set_state(state)  # the batch orders the attempt drew, drawn again
                    resume_random(tasks[i])
                    try:
                        for step in plans[i][stage:]:  # type: ignore[index]
                            losses[i].append(train_stage(step, job.model, job.data, tasks[i].args, job.ctx))
                    except Exception as failed:  # noqa: BLE001 - this client's error reply
                        out[i] = failed
                        del losses[i]
                    else:
                        seconds[i] += time.perf_counter() - t0
                continue
            share = (time.perf_counter() - t0) / len(members)
            for i, loss in zip(members, trained):
                losses[i].append(loss)
                seconds[i] += share
                tasks[i].batched = True
    for i, task in enumerate(tasks):
        if isinstance(out[i], Exception):
            continue
        job = task.job
        try:
            if i in losses:  # e.g. FedCMD's vote in an ``after``, on the trained model
                task.metrics.update(finish_stages(plans[i], losses[i], job.model))  # type: ignore[arg-type]
                out[i] = seconds[i]
                continue
            t0 = time.perf_counter()
            resume_random(task)
            task.metrics.update(task.role.fit(job.model, job.data, task.args, job.ctx))
            out[i] = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - as above
            out[i] = exc
    return out  # type: ignore[return-value]


def role_has_plans(role: str) -> bool:
    """Whether clients of ``role`` can train as :class:`FitPlan` s (its ``fit`` is the base class's,
    which runs the plan); a role that overrides ``fit`` always trains one client at a time."""
    from .roles import ROLES

    return role in ROLES and ROLES[role].fit is Role.fit


def plan_of(task: TrainTask, say: Say) -> Plans | None:
    """The client's plan when its role trains by one this round (its ``fit`` is the base class's,
    which runs the plan), else None, and ``say`` why."""
    role = task.role
    if not role_has_plans(role.name):
        say(role.name, "its training is not written as a FitPlan")
        return None
    plan = role.plan(task.job.model, task.job.data, task.args, task.job.ctx)
    if plan is None:
        say(role.name, "this round's training is not a FitPlan")
    return plan


def group_key(task: TrainTask, plan: FitPlan) -> tuple:
    """Clients that can train a stage as one computation share this: role, architecture (every
    tensor's name, shape and dtype), device, training arguments and the plan's shape."""
    model = task.job.model if plan.model is None else plan.model
    return (
        task.role.name,
        architecture(model),
        str(task.job.ctx.device),
        plan.train_args(task.args),
        None if plan.params is None else tuple(plan.params),
        tuple(_penalty_key(p) for p in plan.penalties()),
        tuple((n, tuple(t.shape)) for n, t in plan.reference.items()),
    )


def architecture(model: nn.Module) -> tuple:
    """What models must share to be stacked: class and every tensor's name, shape and dtype."""
    return type(model).__name__, tuple((n, tuple(t.shape), t.dtype) for n, t in model.state_dict().items())


def _penalty_key(penalty: Any) -> Any:
    """A penalty's identity: the function and its fixed arguments (two ``partial`` objects of one
    function with equal arguments are one penalty)."""
    if isinstance(penalty, partial):
        return (penalty.func, tuple(sorted(penalty.keywords.items())), penalty.args)
    return penalty


class NotBatchable(Exception):
    """A group that cannot run as one computation (the engine runs its clients one at a time)."""


def train_together(
    models: Sequence[nn.Module],
    data: Sequence[tuple[torch.Tensor, torch.Tensor]],
    plans: Sequence[FitPlan],
    args: TrainArgs,
    generators: Sequence[torch.Generator],
    device: torch.device,
) -> list[float]:
    """Train every ``models[k]`` on ``data[k]`` by ``plans[k]``, in place; each client's mean
    batch loss, as :func:`~client_app.training.train` returns it.

    Raises :class:`NotBatchable` (models untouched) where the group cannot be one computation:
    an optimizer other than SGD, or a model ``vmap`` cannot run (randomness such as dropout)."""
    if args.optimizer != "sgd":
        raise NotBatchable(f"optimizer {args.optimizer!r} (the batched engine runs SGD)")
    if args.optimizer_state != "fresh":
        raise NotBatchable("optimizer_state 'kept' (the batched engine's momentum buffers live one round)")
    template = models[0]
    count = len(models)
    named = dict(template.named_parameters())
    wanted = set(plans[0].params) if plans[0].params is not None else set(named)
    trained = [n for n, p in named.items() if n in wanted and p.requires_grad]
    if not trained or (args.epochs <= 0 if args.steps is None else args.steps <= 0):
        return [float("nan")] * count
    group = _Stacked.of(models, plans, device)
    orders = [list(batch_indices(len(y), args, g)) for (_, y), g in zip(data, generators)]
    offsets = torch.tensor([0, *[len(y) for _, y in data]]).cumsum(0)[:-1].tolist()
    x_all = torch.cat([x for x, _ in data]).to(device)
    y_all = torch.cat([y for _, y in data]).to(device)
    batched_loss = vmap(_client_loss(template, plans[0].penalties()))
    template.train()
    for step in range(max((len(o) for o in orders), default=0)):
        by_size: dict[int, list[int]] = {}
        for k, order in enumerate(orders):
            if step < len(order):
                by_size.setdefault(len(order[step]), []).append(k)
        for ks in by_size.values():
            index = torch.stack([orders[k][step] + offsets[k] for k in ks]).to(device)
            group.step(batched_loss, ks, step, (x_all[index], y_all[index]), trained, args)
    group.write_back(models)
    return [float(group.totals[k]) / max(len(orders[k]), 1) for k in range(count)]


def _client_loss(template: nn.Module, penalties: Sequence[Callable]) -> Callable:
    """One client's loss on one batch from its own parameters ``p`` and buffers ``b`` (what vmap maps)."""

    def client_loss(p: dict, b: dict, ref: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(functional_call(template, {**p, **b}, (x,)), y)
        for penalty in penalties:  # in order, as FitPlan.loss_fn adds them
            loss = loss + penalty(p, ref)
        return loss

    return client_loss


@dataclass
class _Stacked:
    """A group's parameters, buffers, penalty references, momentum and summed losses, stacked
    along a first dimension of one row per client."""

    own_params: list[dict[str, torch.Tensor]]
    own_buffers: list[dict[str, torch.Tensor]]
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    reference: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    totals: torch.Tensor

    @classmethod
    def of(cls, models: Sequence[nn.Module], plans: Sequence[FitPlan], device: torch.device) -> _Stacked:
        own_params = [dict(m.named_parameters()) for m in models]
        own_buffers = [dict(m.named_buffers()) for m in models]
        names = list(own_params[0])
        return cls(
            own_params,
            own_buffers,
            {n: torch.stack([mine[n].detach() for mine in own_params]).to(device) for n in names},
            {n: torch.stack([mine[n] for mine in own_buffers]).to(device) for n in own_buffers[0]},
            # each client's penalty reference
            {n: torch.stack([plan.reference[n].to(device) for plan in plans]) for n in plans[0].reference},
            {},
            torch.zeros(len(models), dtype=torch.float64, device=device),
        )

    def step(
        self,
        batched_loss: Callable,
        ks: list[int],
        step: int,
        batch: tuple[torch.Tensor, torch.Tensor],
        trained: list[str],
        args: TrainArgs,
    ) -> None:
        """One SGD step of the clients ``ks`` (those whose batch at ``step`` has one size) on their
        stacked ``batch``."""
        whole = len(ks) == len(self.own_params)
        rows = torch.tensor(ks, device=self.totals.device)
        pick = (lambda t: t) if whole else (lambda t: t[rows])
        p = {n: pick(t).detach().requires_grad_(n in trained) for n, t in self.params.items()}
        b = {n: pick(t) if whole else t[rows].clone() for n, t in self.buffers.items()}
        try:
            losses = batched_loss(p, b, {n: pick(t) for n, t in self.reference.items()}, *batch)
        except RuntimeError as exc:  # e.g. "vmap: called random operation while in randomness error mode"
            if step == 0:
                raise NotBatchable(f"the model does not run under torch.func.vmap ({exc})") from exc
            raise
        grads = torch.autograd.grad(losses.sum(), [p[n] for n in trained])
        with torch.no_grad():
            _sgd_step(self.params, self.momentum, trained, grads, rows, whole, step == 0, args)
            if not whole:
                for n, t in b.items():
                    self.buffers[n][rows] = t
            self.totals[rows] += losses.detach().double()

    @torch.no_grad()
    def write_back(self, models: Sequence[nn.Module]) -> None:
        """Each client's trained row into its own model's parameters and buffers."""
        for k in range(len(models)):
            for n, t in self.own_params[k].items():
                t.copy_(self.params[n][k])
            for n, t in self.own_buffers[k].items():
                t.copy_(self.buffers[n][k])


def _sgd_step(
    params: dict[str, torch.Tensor],
    momentum: dict[str, torch.Tensor],
    trained: list[str],
    grads: Sequence[torch.Tensor],
    rows: torch.Tensor,
    whole: bool,
    first: bool,
    args: TrainArgs,
) -> None:
    """:func:`~models.optim.sgd_update` (``PlainSGD``'s arithmetic) on the stacked rows
    ``rows`` (``whole``: every row, updated in place; else copies written back). Every client
    taking part is at the same step of its own training (all start at step 0), so ``first``
    (no momentum buffer yet) holds for all of them or none."""
    pick = (lambda t: t) if whole else (lambda t: t[rows])
    tensors = [pick(params[n]) for n in trained]
    old = [None if first or args.momentum == 0 else pick(momentum[n]) for n in trained]
    bufs = sgd_update(tensors, list(grads), old, args.lr, args.momentum, args.weight_decay)
    for n, tensor, buf in zip(trained, tensors, bufs):
        if not whole:
            params[n][rows] = tensor
        if buf is not None:
            if whole:
                momentum[n] = buf
            else:
                momentum.setdefault(n, torch.zeros_like(params[n]))[rows] = buf


def evaluate_alone(task: TrainTask, model: nn.Module) -> tuple[int, float, int] | Exception:
    """One client's evaluation of ``model`` on its test split, the seconds added to the task's
    evaluation time; its exception is its result (the client's error reply)."""
    t0 = time.perf_counter()
    try:
        return evaluate(model, task.job.data.x_test, task.job.data.y_test, device=task.job.ctx.device)
    except Exception as exc:  # noqa: BLE001 - this client's error reply
        return exc
    finally:
        task.eval_s += time.perf_counter() - t0


def evaluate_together(
    models: Sequence[nn.Module],
    data: Sequence[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    batch_size: int = 256,
) -> list[tuple[int, float, int]]:
    """:func:`~client_app.training.evaluate` of every ``models[k]`` on ``data[k]``, the models of
    one architecture as one computation: in eval mode (BatchNorm's running statistics), each
    client's test set in its own batches of ``batch_size``, the clients that have a batch at a
    step evaluated together (grouped by batch size, as in training). Each model's (correct,
    summed cross-entropy, samples); the sum in float64 as ``evaluate`` does, its float32 terms
    from another order of reductions (the tolerance of the training). Models of other
    architectures, and a model vmap cannot run, are evaluated one at a time."""
    out: list[tuple[int, float, int] | None] = [None] * len(models)
    groups: dict[tuple, list[int]] = {}
    for k, model in enumerate(models):
        groups.setdefault(architecture(model), []).append(k)
    for members in groups.values():
        try:
            results = _evaluate_group([models[k] for k in members], [data[k] for k in members], device, batch_size)
        except NotBatchable:
            results = [evaluate(models[k], *data[k], batch_size=batch_size, device=device) for k in members]
        for k, result in zip(members, results):
            out[k] = result
    return out  # type: ignore[return-value]


@torch.no_grad()
def _evaluate_group(
    models: Sequence[nn.Module],
    data: Sequence[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    batch_size: int,
) -> list[tuple[int, float, int]]:
    template = models[0]
    if len(models) == 1:
        return [evaluate(template, *data[0], batch_size=batch_size, device=device)]
    state = {n: torch.stack([m.state_dict()[n] for m in models]).to(device) for n in template.state_dict()}
    offsets = torch.tensor([0, *[len(y) for _, y in data]]).cumsum(0)[:-1].tolist()
    x_all = torch.cat([x for x, _ in data]).to(device)
    y_all = torch.cat([y for _, y in data]).to(device)
    correct = torch.zeros(len(models), dtype=torch.int64, device=device)
    loss_sum = torch.zeros(len(models), dtype=torch.float64, device=device)

    def client_eval(s: dict, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = functional_call(template, s, (x,))
        return nn.functional.cross_entropy(logits, y, reduction="sum"), (logits.argmax(dim=1) == y).sum()

    batched = vmap(client_eval)
    was_training = template.training
    template.eval()
    try:
        for start in range(0, max(len(y) for _, y in data), batch_size):
            by_size: dict[int, list[int]] = {}
            for k, (_, y) in enumerate(data):
                if start < len(y):
                    by_size.setdefault(min(batch_size, len(y) - start), []).append(k)
            for size, ks in by_size.items():
                rows = torch.tensor(ks, device=device)
                index = torch.stack([torch.arange(start, start + size) + offsets[k] for k in ks]).to(device)
                try:
                    losses, hits = batched({n: t[rows] for n, t in state.items()}, x_all[index], y_all[index])
                except RuntimeError as exc:
                    raise NotBatchable(f"the model does not run under torch.func.vmap ({exc})") from exc
                loss_sum[rows] += losses.double()
                correct[rows] += hits
    finally:
        template.train(was_training)
    return [(int(correct[k]), float(loss_sum[k]), len(y)) for k, (_, y) in enumerate(data)]
