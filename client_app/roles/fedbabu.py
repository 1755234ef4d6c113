"""FedBABU (Oh et al., ICLR 2022): only the body learns in federated training.

The head keeps its (shared, seeded) initial values during training; before every
evaluation a copy of the model is fine-tuned for ``finetune_epochs`` (SGDRole's
fine-tuning): the whole model (``finetune_part="all"``, the official code) or only the
head (``"head"``).
"""

from __future__ import annotations

from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.roles import FedBabuArgs

from ..training import TrainArgs, train
from .base import RoleContext, SGDRole
from .fedrep import head_groups, split_parameters


class FedBabuRole(SGDRole):
    name = "fedbabu"
    args_type = FedBabuArgs

    def fit(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict[str, float]:
        body, _ = split_parameters(model, head_groups(self.args, ctx))
        loss = train(
            model, data.x_train, data.y_train, train_args, params=body, generator=ctx.generator, device=ctx.device
        )
        return {"train_loss": loss}

    def finetune_params(self, model: nn.Module, ctx: RoleContext) -> list[nn.Parameter] | None:
        return None if self.args.finetune_part == "all" else split_parameters(model, head_groups(self.args, ctx))[1]
