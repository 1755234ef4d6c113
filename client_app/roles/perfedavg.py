"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020): the shared model is a
starting point that one gradient step on a client's own data turns into its personal model.

Each local meta step takes consecutive batches D, D' (and D'' for ``hf``) of the client's
training split, at the model's parameters theta:

- theta' = theta - alpha * grad f(theta; D)               (the inner step, alpha the run's lr)
- g = grad f(theta'; D')                                  (first-order MAML, ``fo``)
- ``hf``: g <- g - alpha * H(theta; D'') g, the Hessian-vector product by finite differences,
  (grad f(theta + delta g; D'') - grad f(theta - delta g; D'')) / (2 delta)
- theta <- theta - beta * g                               (the meta step)

Before each evaluation a copy of the model takes ``adapt_steps`` inner steps on training batches
(the paper: one): that copy is what ``test_before`` and ``test_after`` measure. The steps are
plain SGD, as the paper states them.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option
from pflower.protocol.role_args import RoleArgs

from ..training import TrainArgs, batch_indices
from .base import Role, RoleContext, check_plain_sgd

VERSIONS = ("fo", "hf")
Batch = tuple[torch.Tensor, torch.Tensor]


def _grads(model: nn.Module, params: list[nn.Parameter], batch: Batch) -> list[torch.Tensor]:
    x, y = batch
    return list(torch.autograd.grad(nn.functional.cross_entropy(model(x), y), params))


@torch.no_grad()
def _set(params: list[nn.Parameter], values: Sequence[torch.Tensor]) -> None:
    for p, v in zip(params, values):
        p.copy_(v)


def meta_step(model: nn.Module, batches: Sequence[Batch], alpha: float, beta: float, delta: float) -> float:
    """One Per-FedAvg step of ``model`` in place on two batches (first-order) or three (Hessian-free:
    the third estimates the Hessian-vector product); the loss at the adapted parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    theta = [p.detach().clone() for p in params]
    inner = _grads(model, params, batches[0])
    _set(params, [t - alpha * g for t, g in zip(theta, inner)])
    x1, y1 = batches[1]
    loss = nn.functional.cross_entropy(model(x1), y1)
    outer = list(torch.autograd.grad(loss, params))
    if len(batches) > 2:  # hf: minus alpha * H(theta; D'') g
        _set(params, [t + delta * g for t, g in zip(theta, outer)])
        plus = _grads(model, params, batches[2])
        _set(params, [t - delta * g for t, g in zip(theta, outer)])
        minus = _grads(model, params, batches[2])
        outer = [g - alpha * (p - m) / (2 * delta) for g, p, m in zip(outer, plus, minus)]
    _set(params, [t - beta * g for t, g in zip(theta, outer)])
    return float(loss.detach())


def adapted(model: nn.Module, batches: Sequence[Batch], alpha: float) -> nn.Module:
    """A copy of ``model`` after one plain gradient step of rate ``alpha`` on each batch."""
    copy_ = copy.deepcopy(model)
    copy_.train()
    params = [p for p in copy_.parameters() if p.requires_grad]
    for batch in batches:
        _set(params, [p.detach() - alpha * g for p, g in zip(params, _grads(copy_, params, batch))])
    return copy_


@dataclass(frozen=True)
class PerFedAvgArgs(RoleArgs):
    """Per-FedAvg's client: MAML meta steps, one adaptation step before evaluating."""

    version: str = option(
        "fo",
        "fo: first-order MAML; hf: Hessian-free, the Hessian-vector product by finite differences",
        choices=VERSIONS,
    )
    beta: float = option(
        0.001, "the meta step's rate (the run's lr is the inner step's alpha; FL-bench: 0.001)", above=0
    )
    delta: float = option(0.001, "hf: the finite-difference width of the Hessian-vector product", above=0)
    adapt_steps: int = option(1, "inner steps on training batches before each evaluation (paper: 1)", low=0)


class PerFedAvgRole(Role):
    """Meta steps over consecutive batches of the round's batch stream (2 a step, 3 for ``hf``)."""

    name = "perfedavg"
    args_type = PerFedAvgArgs

    def _batches(self, data: ClientData, args: TrainArgs, ctx: RoleContext) -> list[Batch]:
        x, y = data.x_train.to(ctx.device), data.y_train.to(ctx.device)
        return [(x[i.to(ctx.device)], y[i.to(ctx.device)]) for i in batch_indices(len(y), args, ctx.generator)]

    def fit_alone(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict:
        check_plain_sgd(train_args, "perfedavg")
        per_step = 2 if self.args.version == "fo" else 3
        batches = self._batches(data, train_args, ctx)
        model.train()
        losses = [
            meta_step(model, batches[i : i + per_step], train_args.lr, self.args.beta, self.args.delta)
            for i in range(0, len(batches) - per_step + 1, per_step)
        ]
        self._trained = self.eval_model(model, data, train_args, ctx)  # test_after: the trained model, adapted
        return {"train_loss": sum(losses) / max(len(losses), 1)}

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        steps = int(self.args.adapt_steps)
        if steps <= 0:
            return model
        batches = self._batches(data, replace(train_args, epochs=1, steps=steps, optimizer_state="fresh"), ctx)
        return adapted(model, batches, train_args.lr)

    def trained_model(self, model: nn.Module, ctx: RoleContext) -> nn.Module:
        return getattr(self, "_trained", model)
