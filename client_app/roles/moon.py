"""MOON's client side (Li et al., CVPR 2021): a model-contrastive term on the body's output.

loss = CE + mu * l_con with, for the representation z = model.features(x),
l_con = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) ),
sim the cosine, z_glob from a frozen copy of the received global model and z_prev from a frozen
copy of this client's model after its previous round (persisted in ``ctx.extra_state``; on
first contact the received model, which makes l_con a constant). The frozen copies run in
eval mode (their BN statistics do not drift).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from pflower.federated_data import ClientData
from pflower.protocol.options import option
from pflower.protocol.role_args import RoleArgs

from ..training import LossFn, TrainArgs
from .base import Role, RoleContext, train_own

PREFIX = "moon.prev."


def contrastive_term(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """l_con averaged over the batch (rows of [batch, features] tensors)."""
    pos = F.cosine_similarity(z, z_glob, dim=1) / tau
    neg = F.cosine_similarity(z, z_prev, dim=1) / tau
    # -log(e^pos / (e^pos + e^neg)) is the cross-entropy of the logits [pos, neg] with target 0
    return F.cross_entropy(torch.stack([pos, neg], dim=1), torch.zeros(len(z), dtype=torch.long, device=z.device))


def frozen(model: nn.Module) -> nn.Module:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def moon_loss(global_model: nn.Module, prev_model: nn.Module, mu: float, tau: float) -> LossFn:
    """CE + mu * l_con, from one forward pass of the body and the classifier."""

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = model.features(x)
        logits = list(model.groups.values())[-1](z)
        with torch.no_grad():
            z_glob, z_prev = global_model.features(x), prev_model.features(x)
        return F.cross_entropy(logits, y) + mu * contrastive_term(
            z.flatten(1), z_glob.flatten(1), z_prev.flatten(1), tau
        )

    return loss


def previous_model(model: nn.Module, ctx: RoleContext) -> nn.Module:
    """A frozen copy holding this client's model after its last round (the received one at first)."""
    prev = copy.deepcopy(model)
    saved = ctx.kept(PREFIX)
    if saved:
        prev.load_state_dict(saved)
    return frozen(prev)


@dataclass(frozen=True)
class MOONArgs(RoleArgs):
    """MOON's client: CE + mu * the contrastive term at temperature tau."""

    mu: float = option(
        1.0, "weight of the contrastive term (paper: 5 on CIFAR-10, 1 on CIFAR-100/Tiny-ImageNet)", low=0
    )
    tau: float = option(0.5, "temperature of the contrastive term", above=0)


class MOONRole(Role):
    name = "moon"
    args_type = MOONArgs

    def fit(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict[str, float]:
        mu, tau = self.args.mu, self.args.tau
        loss_fn = moon_loss(frozen(copy.deepcopy(model)), previous_model(model, ctx), mu, tau)
        loss = train_own(model, data, train_args, ctx, loss_fn)
        ctx.keep(PREFIX, model.state_dict())
        return {"train_loss": loss}
