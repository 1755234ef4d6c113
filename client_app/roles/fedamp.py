"""FedAMP's client side: SGD on F_i(w) + lam/2 ||w - u_i||^2 (Huang et al., AAAI 2021).

The model trained and evaluated is the client's own w_i (persisted: every group is personal);
u_i, its personalized cloud model, arrives as extra arrays ``u/<key>``. The pull is
:mod:`.proximal`'s term with u_i as the reference (``mu`` = FedAMP's lam).
"""

from __future__ import annotations

import torch
from torch import nn

from pflower.protocol.roles import CLOUD_PREFIX, FedAMPArgs

from .base import RoleContext
from .proximal import ProximalRole, snapshot


class FedAMPRole(ProximalRole):
    name = "fedamp"
    args_type = FedAMPArgs

    def reference(self, model: nn.Module, ctx: RoleContext) -> dict[str, torch.Tensor]:
        cloud = {
            k[len(CLOUD_PREFIX) :]: t.to(ctx.device)
            for k, t in ctx.received_extra.items()
            if k.startswith(CLOUD_PREFIX)
        }
        return cloud or snapshot(model)  # no cloud model sent: no pull
