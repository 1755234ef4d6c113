"""FedAMP's client side: SGD on F_i(w) + lam/2 ||w - u_i||^2 (Huang et al., AAAI 2021).

The model trained and evaluated is the client's own w_i (persisted: every group is personal);
u_i, its personalized cloud model, arrives as extra arrays ``u/<key>``. The pull is
:mod:`.proximal`'s term with u_i as the reference and lam as its weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pflower.protocol.options import option

from .base import RoleContext, SGDArgs
from .proximal import ProximalRole, snapshot

CLOUD_PREFIX = "u/"  # the cloud model u_i travels as extra arrays "u/<key>"


@dataclass(frozen=True)
class FedAMPArgs(SGDArgs):
    """FedAMP's client: the proximal pull toward its cloud model u_i."""

    lam: float = option(1.0, "the pull of each client toward its cloud model u_i", low=0)


class FedAMPRole(ProximalRole):
    name = "fedamp"
    args_type = FedAMPArgs

    def pull(self) -> float:
        return float(self.args.lam)

    def reference(self, model: nn.Module, ctx: RoleContext) -> dict[str, torch.Tensor]:
        cloud = {
            k[len(CLOUD_PREFIX) :]: t.to(ctx.device)
            for k, t in ctx.received_extra.items()
            if k.startswith(CLOUD_PREFIX)
        }
        return cloud or snapshot(model)  # no cloud model sent: no pull
