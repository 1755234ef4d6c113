"""FedALA (Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated Learning",
AAAI 2023): before it trains, a client mixes the received global model into its own local one,
element by element, with weights it learns.

For the top ``layers`` layer groups, the initial model of the round is

    theta_hat = theta_local + (theta_global - theta_local) * W,      W in [0, 1], element-wise,

and the lower groups take the global values. W starts at ones (the global model) and learns on a
random ``sample_percent`` of the client's training data: per batch, W <- clip(W - eta * grad *
(theta_global - theta_local), 0, 1) with the gradient of the loss at theta_hat. In the client's
first adaptive round W trains until the standard deviation of the last ``converge_window`` losses
falls below ``converge_threshold``; later rounds take one pass. The client's first contact has no
local model: it starts from the global one. theta_hat is what ``test_before`` measures and what
the round trains (plain SGD) and sends; the trained model is the client's local model for the
next round, kept with W in ``ctx.extra_state``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option
from pflower.protocol.role_args import RoleArgs

from ..training import TrainArgs, batch_indices
from .base import Role, RoleContext, train_own

LOCAL = "fedala.local."  # the client's trained model of its previous round
WEIGHTS = "fedala.w."  # the learned element-wise weights of the top groups
STARTED = "fedala.started"  # present once the first adaptive round has trained W to convergence
MAX_PASSES = 200  # a bound on the first round's passes (the paper's loop has none)


def mixed(local: torch.Tensor, global_: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """theta_local + (theta_global - theta_local) * W, element by element."""
    return local + (global_ - local) * weight


def weight_step(
    weight: torch.Tensor, grad: torch.Tensor, local: torch.Tensor, global_: torch.Tensor, eta: float
) -> torch.Tensor:
    """W <- clip(W - eta * grad * (theta_global - theta_local), 0, 1): the chain rule through the mix."""
    return torch.clamp(weight - eta * grad * (global_ - local), 0.0, 1.0)


def converged(losses: list[float], window: int, threshold: float) -> bool:
    """More than ``window`` losses, and the last ``window`` of them spread less than ``threshold``."""
    return len(losses) > window and statistics.pstdev(losses[-window:]) < threshold


@dataclass(frozen=True)
class FedALAArgs(RoleArgs):
    """FedALA's client: the adaptive local aggregation of the top groups before training."""

    layers: int = option(1, "top layer groups mixed element-wise (the paper's p; 1: the classifier)", low=1)
    eta: float = option(1.0, "the weights' learning rate (paper, PFLlib: 1.0)", above=0)
    sample_percent: float = option(
        80.0, "share of the training data the weights learn on, in % (paper: 80)", above=0, high=100
    )
    converge_threshold: float = option(
        0.1, "first round: stop when the losses' SD falls below this (PFLlib: 0.1)", above=0
    )
    converge_window: int = option(10, "first round: the number of last losses whose SD is compared (PFLlib: 10)", low=2)


class FedALARole(Role):
    """ALA on the received model (once per round, before ``test_before``), then plain training."""

    name = "fedala"
    args_type = FedALAArgs

    def adapt(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        """The received ``model`` turned into theta_hat in place (it stays the global one on first contact)."""
        local = ctx.kept(LOCAL)
        if not local:
            return model
        top = set(model.group_names[-int(self.args.layers) :])
        names = [n for n, p in model.named_parameters() if p.requires_grad and n.split(".")[1] in top]
        params = dict(model.named_parameters())
        global_ = {n: params[n].detach().clone() for n in names}
        local = {n: local[n].to(ctx.device) for n in names}
        weights = {n: ctx.extra_state.get(WEIGHTS + n, torch.ones_like(global_[n])).to(ctx.device) for n in names}
        batches = self._sample(data, train_args, ctx)
        losses: list[float] = []
        first = STARTED not in ctx.extra_state
        model.train()
        for _ in range(MAX_PASSES if first else 1):
            for x, y in batches:
                with torch.no_grad():
                    for n in names:
                        params[n].copy_(mixed(local[n], global_[n], weights[n]))
                loss = nn.functional.cross_entropy(model(x), y)
                grads = torch.autograd.grad(loss, [params[n] for n in names])
                weights = {
                    n: weight_step(weights[n], g, local[n], global_[n], self.args.eta) for n, g in zip(names, grads)
                }
            losses.append(float(loss.detach()))
            if not first or converged(losses, int(self.args.converge_window), float(self.args.converge_threshold)):
                break
        with torch.no_grad():
            for n in names:
                params[n].copy_(mixed(local[n], global_[n], weights[n]))
        ctx.extra_state.update({WEIGHTS + n: w.detach().cpu().clone() for n, w in weights.items()})
        ctx.extra_state[STARTED] = torch.tensor(1)
        return model

    def _sample(
        self, data: ClientData, train_args: TrainArgs, ctx: RoleContext
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A contiguous ``sample_percent`` of the training split from a random start (PFLlib's draw), in
        batches of the run's size."""
        n = len(data.y_train)
        size = max(2, int(n * float(self.args.sample_percent) / 100))
        start = int(torch.randint(0, max(n - size, 0) + 1, (1,), generator=ctx.generator))
        x, y = data.x_train[start : start + size].to(ctx.device), data.y_train[start : start + size].to(ctx.device)
        one_pass = replace(train_args, epochs=1, steps=None)
        return [(x[i.to(ctx.device)], y[i.to(ctx.device)]) for i in batch_indices(len(y), one_pass, ctx.generator)]

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        if not getattr(self, "_adapted", False):
            self.adapt(model, data, train_args, ctx)
            self._adapted = True
        return model

    def fit_alone(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict:
        self.eval_model(model, data, train_args, ctx)  # theta_hat, if test_before did not make it
        loss = train_own(model, data, train_args, ctx)
        ctx.keep(LOCAL, model.state_dict())
        return {"train_loss": loss}
