"""FedRep (Collins et al., 2021): the head (personal) is trained first, then the body.

Each round: E - body_epochs epochs on the head with the body fixed, then body_epochs
epochs on the body with the head fixed (FL-bench's split of the E local epochs; the
papers compared use body_epochs = 1). Which groups are the head comes from the server
(``head`` in the role arguments; default: the message's personal groups).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option, sent
from pflower.protocol.role_args import RoleArgs

from ..training import TrainArgs
from .base import FitPlan, Role, RoleContext


def split_parameters(model: nn.Module, head: Sequence[str]) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(body, head) parameters of a LayeredNet: ``head`` are group names, the body is the rest."""
    groups = model.groups  # type: ignore[attr-defined]
    unknown = set(head) - set(groups.keys())
    if unknown:
        raise KeyError(f"unknown head group(s) {sorted(unknown)}; model groups: {list(groups.keys())}")
    body = [p for g, m in groups.items() if g not in head for p in m.parameters()]
    return body, [p for g in head for p in groups[g].parameters()]


def head_groups(head: Sequence[str], ctx: RoleContext) -> list[str]:
    """The head: the groups the server named (``head``), else the message's personal groups."""
    return list(head or ctx.personal)


def parameter_names(model: nn.Module, params: Sequence[nn.Parameter]) -> list[str]:
    """The names (``model.named_parameters()``) of ``params``."""
    ids = {id(p) for p in params}
    return [name for name, p in model.named_parameters() if id(p) in ids]


@dataclass(frozen=True)
class FedRepArgs(RoleArgs):
    """FedRep's client: E - body_epochs head epochs, then body_epochs body epochs."""

    body_epochs: int = option(
        1, "of the E local epochs, the last ones that train the body (the ones before train the head)", low=0
    )
    head: list[str] = sent([], "the head's groups (empty: the message's personal groups)")


class FedRepRole(Role):
    """Two stages: the head for E - body_epochs epochs, then the body for body_epochs."""

    name = "fedrep"
    args_type = FedRepArgs

    def plan(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> list[FitPlan]:
        body_epochs = min(int(self.args.body_epochs), train_args.epochs)
        body, head = split_parameters(model, head_groups(self.args.head, ctx))
        return [
            FitPlan(params=parameter_names(model, head), epochs=train_args.epochs - body_epochs, loss_name="head_loss"),
            FitPlan(params=parameter_names(model, body), epochs=body_epochs, loss_name="body_loss"),
        ]
