"""pFedMe (Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS
2020): each client's personalized model theta solves, near its local copy w of the global model,

    theta(w) = argmin f(theta) + lam / 2 * ||theta - w||^2,

approximately, by ``k`` gradient steps of rate ``personal_lr`` on each batch; then w moves toward
it, w <- w - lr * lam * (w - theta) (lr: the run's). The client sends w; the server mixes the
average into the global model by ``beta`` (:mod:`pflower.strategies.pfedme`). theta is what the
client is evaluated on: ``test_after`` the one just computed, ``test_before`` the one of the
client's previous round (the received model on first contact). The steps are plain gradient
steps, as the paper writes them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option
from pflower.protocol.role_args import RoleArgs

from ..training import TrainArgs, batch_indices
from .base import Role, RoleContext, check_plain_sgd

PREFIX = "pfedme.theta."  # the last personalized model's tensors in ctx.extra_state


@torch.no_grad()
def personal_step(
    theta: list[torch.Tensor], grads: list[torch.Tensor], w: list[torch.Tensor], lr: float, lam: float, mu: float
) -> None:
    """One step on f(theta) + lam/2 ||theta - w||^2 (+ mu/2 ||theta||^2), in place."""
    for t, g, wl in zip(theta, grads, w):
        t.sub_(lr * (g + lam * (t - wl) + mu * t))


@torch.no_grad()
def local_step(w: list[torch.Tensor], theta: list[torch.Tensor], lr: float, lam: float) -> None:
    """w <- w - lr * lam * (w - theta): the gradient step on the Moreau envelope at w, in place."""
    for wl, t in zip(w, theta):
        wl.sub_(lr * lam * (wl - t))


@dataclass(frozen=True)
class PFedMeArgs(RoleArgs):
    """pFedMe's client: k steps toward the personalized model each batch, then w toward it."""

    lam: float = option(15.0, "the pull lam between the personalized model and w (paper and peers: 15)", above=0)
    k: int = option(5, "gradient steps on the personalized model per batch (paper and peers: 5)", low=1)
    personal_lr: float = option(0.01, "the personalized steps' rate (FL-bench: 0.01)", above=0)
    mu: float = option(
        0.0, "an L2 term mu * theta in the personalized step (the authors' code and both peers: 0.001)", low=0
    )


class PFedMeRole(Role):
    """Its own loop: the personalized model trains on a copy; the received model becomes w."""

    name = "pfedme"
    args_type = PFedMeArgs

    def fit_alone(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict:
        check_plain_sgd(train_args, "pfedme")
        theta_model = copy.deepcopy(model)  # theta starts at the received model, as w does
        theta = [p for p in theta_model.parameters() if p.requires_grad]
        w = [p.detach().clone() for p in model.parameters() if p.requires_grad]
        x, y = data.x_train.to(ctx.device), data.y_train.to(ctx.device)
        theta_model.train()
        total, batches = torch.zeros((), dtype=torch.float64, device=ctx.device), 0  # summed on the device
        for idx in batch_indices(len(y), train_args, ctx.generator):
            xb, yb = x[idx.to(ctx.device)], y[idx.to(ctx.device)]
            for _ in range(int(self.args.k)):
                loss = nn.functional.cross_entropy(theta_model(xb), yb)
                grads = list(torch.autograd.grad(loss, theta))
                personal_step(theta, grads, w, self.args.personal_lr, self.args.lam, self.args.mu)
            total += loss.detach().double()
            batches += 1
            local_step(w, theta, train_args.lr, self.args.lam)
        with torch.no_grad():  # the reply carries w
            for p, wl in zip((p for p in model.parameters() if p.requires_grad), w):
                p.copy_(wl)
            personal_buffers = dict(theta_model.named_buffers())
            for name, buf in model.named_buffers():  # BN statistics: the personalized pass's
                buf.copy_(personal_buffers[name])
        ctx.keep(PREFIX, theta_model.state_dict())
        self._trained = theta_model
        return {"train_loss": float(total) / max(batches, 1)}

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        saved = ctx.kept(PREFIX)
        if not saved:
            return model
        theta = copy.deepcopy(model)
        theta.load_state_dict(saved)
        return theta

    def trained_model(self, model: nn.Module, ctx: RoleContext) -> nn.Module:
        return getattr(self, "_trained", model)
