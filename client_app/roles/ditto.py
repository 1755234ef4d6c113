"""Ditto (Li et al., ICML 2021): a global model by FedAvg plus a personal model kept on the client.

Each round the received global w trains like FedAvg (E epochs, uploaded), and the personal
model v trains ``personal_epochs`` epochs on F(v) + lam/2 ||v - w||^2 with w the received
global (:mod:`.proximal`). v (parameters and BN buffers) lives in ``ctx.extra_state``
between rounds; on first contact it starts from the received global model. ``test_before``,
``test_after`` and the final evaluation use v.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace

from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.roles import DittoArgs

from ..training import TrainArgs, train
from .base import Role, RoleContext
from .proximal import proximal_loss, snapshot

PREFIX = "ditto."


def personal_model(model: nn.Module, ctx: RoleContext) -> nn.Module:
    """A copy of ``model`` holding the persisted personal model v (the copy itself on first contact)."""
    v = copy.deepcopy(model)
    saved = {k[len(PREFIX) :]: t for k, t in ctx.extra_state.items() if k.startswith(PREFIX)}
    if saved:
        v.load_state_dict(saved)
    return v


class DittoRole(Role):
    name = "ditto"
    args_type = DittoArgs

    def fit(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict[str, float]:
        lam = self.args.lam
        epochs = self.args.personal_epochs
        personal_args = train_args if epochs is None else replace(train_args, epochs=int(epochs), steps=None)
        v = personal_model(model, ctx)
        reference = snapshot(model)  # the received global w^t
        personal_loss = train(
            v,
            data.x_train,
            data.y_train,
            personal_args,
            loss_fn=proximal_loss(reference, lam),
            generator=ctx.generator,
            device=ctx.device,
        )
        loss = train(model, data.x_train, data.y_train, train_args, generator=ctx.generator, device=ctx.device)
        ctx.extra_state.update({PREFIX + k: t.detach().cpu().clone() for k, t in v.state_dict().items()})
        self._trained = v
        metrics = {"train_loss": loss}
        if math.isfinite(personal_loss):  # NaN with 0 personal epochs
            metrics["personal_loss"] = personal_loss
        return metrics

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        return personal_model(model, ctx)

    def trained_model(self, model: nn.Module, ctx: RoleContext) -> nn.Module:
        trained = getattr(self, "_trained", None)
        return personal_model(model, ctx) if trained is None else trained
