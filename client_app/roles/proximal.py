"""A proximal pull toward the received model: FedProx's local objective and Ditto's personal step.

F(w) + mu/2 * ||w - w_ref||^2, with w_ref the tensors the client received this round
(snapshotted when ``fit`` starts). The term is a plain function of a model and a
reference so it is unit-tested on hand-built tensors; :func:`proximal_loss` turns it
into the ``loss_fn`` of :func:`client_app.training.train`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option

from ..training import LossFn, TrainArgs, cross_entropy
from .base import FitPlan, Penalty, RoleContext, SGDArgs, SGDRole


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of the model's trainable parameters, by name (the reference w_ref)."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def proximal_penalty(
    params: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor], mu: float, prefix: str = ""
) -> torch.Tensor:
    """mu/2 * sum_k ||w_k - ref_k||^2 over the parameters named in ``reference`` (differentiable);
    ``params`` by name (a module's, or one client's slice of the batched engine's). With
    ``prefix``, only the reference keys ``prefix + name`` count (a plan with other tensors too)."""
    terms = [((params[k[len(prefix) :]] - ref) ** 2).sum() for k, ref in reference.items() if k.startswith(prefix)]
    return 0.5 * mu * torch.stack(terms).sum() if terms else torch.zeros(())


def proximal_terms(mu: float, prefix: str = "") -> tuple[Penalty, ...]:
    """The :class:`FitPlan` penalties of mu/2 ||w - ref||^2 (reference keys ``prefix + name``):
    none at mu = 0, where :func:`proximal_loss` adds no term either."""
    return () if mu == 0 else (partial(proximal_penalty, mu=mu, prefix=prefix),)


def proximal_term(model: nn.Module, reference: Mapping[str, torch.Tensor], mu: float) -> torch.Tensor:
    """:func:`proximal_penalty` on a module's parameters."""
    return proximal_penalty(dict(model.named_parameters()), reference, mu)


def proximal_loss(reference: Mapping[str, torch.Tensor], mu: float, base: LossFn = cross_entropy) -> LossFn:
    """``base`` plus the proximal term toward ``reference`` (``base`` alone when mu is 0)."""
    if mu == 0:
        return base

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return base(model, x, y) + proximal_term(model, reference, mu)

    return loss


@dataclass(frozen=True)
class ProximalArgs(SGDArgs):
    """FedProx: F(w) + mu/2 ||w - w_received||^2."""

    mu: float = option(1.0, "proximal weight (FedCMD/FedCPMD baselines: 1; FedTSDP recommends 0.01)", low=0)


class ProximalRole(SGDRole):
    """FedProx (Li et al., 2020): local SGD on F(w) + mu/2 ||w - w_global||^2."""

    name = "proximal"
    args_type = ProximalArgs

    def plan(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> FitPlan | None:
        terms = proximal_terms(self.pull())
        return FitPlan(penalty=terms, reference=self.reference(model, ctx)) if terms else FitPlan()

    def pull(self) -> float:
        """mu, the term's weight (FedAMP: its lam)."""
        return float(self.args.mu)

    def reference(self, model: nn.Module, ctx: RoleContext) -> dict[str, torch.Tensor]:
        """What the term pulls toward: the received model (FedProx); FedAMP: its cloud model u_i."""
        return snapshot(model)
