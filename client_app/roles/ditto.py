"""Ditto (Li et al., ICML 2021): a global model by FedAvg plus a personal model kept on the client.

Each round the received global w trains like FedAvg (E epochs, uploaded), and the personal
model v trains ``personal_epochs`` epochs on F(v) + lam/2 ||v - w||^2 with w the received
global (:mod:`.proximal`). v (parameters and BN buffers) lives in ``ctx.extra_state``
between rounds; on first contact it starts from the received global model. ``test_before``,
``test_after`` and the final evaluation use v.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option
from pflower.protocol.role_args import RoleArgs

from ..training import TrainArgs
from .base import FitPlan, Role, RoleContext
from .proximal import proximal_terms, snapshot

PREFIX = "ditto."


def personal_model(model: nn.Module, ctx: RoleContext) -> nn.Module:
    """A copy of ``model`` holding the persisted personal model v (the copy itself on first contact)."""
    v = copy.deepcopy(model)
    saved = ctx.kept(PREFIX)
    if saved:
        v.load_state_dict(saved)
    return v


@dataclass(frozen=True)
class DittoArgs(RoleArgs):
    """Ditto's client: a personal model v trained on F(v) + lam/2 ||v - w_global||^2."""

    lam: float = option(0.1, "pull of the personal model toward the global one (FedTSDP recommends 0.1)", low=0)
    personal_epochs: int | None = option(
        None, "epochs on the personal model a round (null: the run's local_epochs)", low=0
    )


class DittoRole(Role):
    """Two stages: the personal model v on F(v) + lam/2 ||v - w||^2, then the received w by plain
    SGD (that order: each client's batch order comes from its generator in this sequence)."""

    name = "ditto"
    args_type = DittoArgs

    def plan(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> list[FitPlan]:
        terms = proximal_terms(self.args.lam)
        v = personal_model(model, ctx)
        self._trained = v

        def keep(trained: nn.Module) -> dict[str, float]:
            ctx.keep(PREFIX, trained.state_dict())
            return {}

        personal = FitPlan(
            penalty=terms,
            reference=snapshot(model) if terms else {},  # the received global w^t
            model=v,
            epochs=self.args.personal_epochs,
            loss_name="personal_loss",
            after=keep,
        )
        return [personal, FitPlan()]

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        return personal_model(model, ctx)

    def trained_model(self, model: nn.Module, ctx: RoleContext) -> nn.Module:
        trained = getattr(self, "_trained", None)
        return personal_model(model, ctx) if trained is None else trained
