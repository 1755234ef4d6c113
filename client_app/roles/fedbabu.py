"""FedBABU (Oh et al., ICLR 2022): only the body learns in federated training.

The head keeps its (shared, seeded) initial values during training; before every
evaluation a copy of the model is fine-tuned for ``finetune_epochs`` (SGDRole's
fine-tuning): the whole model (``finetune_part="all"``, the official code) or only the
head (``"head"``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option, sent
from pflower.protocol.role_args import RoleArgs

from ..training import TrainArgs
from .base import FitPlan, RoleContext, SGDRole
from .fedrep import head_groups, split_parameters

FINETUNE_PARTS = ("all", "head")  # what the pre-evaluation fine-tuning updates


@dataclass(frozen=True)
class FedBabuArgs(RoleArgs):
    """FedBABU's client: only the body trains; a copy is fine-tuned before each evaluation."""

    finetune_epochs: int = option(
        5, "fine-tuning before each evaluation (official code: 5; 0: the frozen head as is)", low=0
    )
    finetune_part: str = option(
        "all", "what the fine-tuning updates: all (official code) or head", choices=FINETUNE_PARTS
    )
    head: list[str] = sent([], "the head's groups (empty: the message's personal groups)")


class FedBabuRole(SGDRole):
    name = "fedbabu"
    args_type = FedBabuArgs

    def plan(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> FitPlan | None:
        """The body only (the head stays at its initial value, FedBABU paper)."""
        body = {id(p) for p in split_parameters(model, head_groups(self.args.head, ctx))[0]}
        return FitPlan(params=[name for name, p in model.named_parameters() if id(p) in body])

    def finetune_params(self, model: nn.Module, ctx: RoleContext) -> list[nn.Parameter] | None:
        return (
            None if self.args.finetune_part == "all" else split_parameters(model, head_groups(self.args.head, ctx))[1]
        )
