"""FedDyn's client side (Acar et al., ICLR 2021): a dynamic regularizer with per-client state.

Client i minimizes L_i(w) - <g_i, w> + alpha/2 ||w - w_global||^2, w_global the received model,
then updates its state g_i <- g_i - alpha (w_i - w_global) (g_i approximates the gradient of L_i
at its last local optimum). g_i starts at 0 and lives in ``ctx.extra_state`` between rounds.
The terms are plain functions of a model and tensors, unit-tested on hand numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option
from pflower.protocol.role_args import RoleArgs

from ..training import LossFn, TrainArgs, cross_entropy
from .base import FitPlan, Role, RoleContext
from .proximal import proximal_loss, proximal_terms, snapshot

PREFIX = "feddyn.g."
G_PREFIX, W_PREFIX = "g/", "w/"  # the plan's reference tensors: the state g, the received w


def linear_term(model: nn.Module, g: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """<g, w> = sum_k <g_k, w_k> over the parameters named in ``g`` (differentiable)."""
    return linear_penalty_of(dict(model.named_parameters()), g)


def linear_penalty_of(params: Mapping[str, torch.Tensor], g: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """<g, w> on parameters by name (a module's, or one client's slice of the batched engine's)."""
    terms = [(params[k] * gk).sum() for k, gk in g.items()]
    return torch.stack(terms).sum() if terms else torch.zeros(())


def linear_penalty(params: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """-<g, w>, g the reference tensors under ``G_PREFIX`` (FedDyn's first penalty)."""
    return -linear_penalty_of(params, {k[len(G_PREFIX) :]: t for k, t in reference.items() if k.startswith(G_PREFIX)})


def feddyn_loss(reference: Mapping[str, torch.Tensor], g: Mapping[str, torch.Tensor], alpha: float) -> LossFn:
    """CE - <g, w> + alpha/2 ||w - reference||^2."""

    def base(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return cross_entropy(model, x, y) - linear_term(model, g)

    return proximal_loss(reference, alpha, base)


def updated_state(
    g: Mapping[str, torch.Tensor],
    trained: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor],
    alpha: float,
) -> dict[str, torch.Tensor]:
    """g_k - alpha (w_k - reference_k) for every key of ``g``."""
    return {k: g[k] - alpha * (trained[k] - reference[k]) for k in g}


@dataclass(frozen=True)
class FedDynArgs(RoleArgs):
    """FedDyn's client: CE - <g_i, w> + alpha/2 ||w - w_global||^2."""

    alpha: float = option(0.01, "regularization weight (FedCMD/FedCPMD baselines: 0.01)", above=0)


class FedDynRole(Role):
    """One plan: CE + (-<g, w>) + alpha/2 ||w - w_global||^2 (added in that order, as
    :func:`feddyn_loss`), then g updated from the trained model."""

    name = "feddyn"
    args_type = FedDynArgs

    def plan(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> FitPlan:
        alpha = self.args.alpha
        reference = snapshot(model)  # the received global model
        g = {k: ctx.extra_state.get(PREFIX + k, torch.zeros_like(ref)).to(ref.device) for k, ref in reference.items()}

        def update_state(trained: nn.Module) -> dict[str, float]:
            new_g = updated_state(g, snapshot(trained), reference, alpha)
            ctx.extra_state.update({PREFIX + k: v.detach().cpu() for k, v in new_g.items()})
            return {}

        return FitPlan(
            penalty=(linear_penalty, *proximal_terms(alpha, W_PREFIX)),
            reference={**{G_PREFIX + k: t for k, t in g.items()}, **{W_PREFIX + k: t for k, t in reference.items()}},
            after=update_state,
        )
