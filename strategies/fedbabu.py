"""FedBABU (Oh et al., ICLR 2022): the head stays frozen at its (seeded) initial values and is
never sent; only the body is trained and FedAvg'd; clients fine-tune before evaluating."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from typing_extensions import override

from pflower.protocol.roles import FINETUNE_PARTS, FedBabuArgs

from .base.options import MethodOptions, option
from .fedper import FedPer


@dataclass(frozen=True)
class FedBabuOptions(MethodOptions):
    """FedBabu's options (``method.<name>=`` on the command line, keywords of ``FedBabu(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    finetune_epochs: int = option(
        5, "fine-tuning before each evaluation (official code: 5; 0: the frozen head as is)", low=0
    )
    finetune_part: str = option(
        "all", "what the fine-tuning updates: all (official code) or head", choices=FINETUNE_PARTS
    )


class FedBabu(FedPer):
    """FedPer with the head frozen at its seeded init and fine-tuned before evaluation (options:
    :class:`FedBabuOptions`)."""

    name = "fedbabu"
    options_type = FedBabuOptions
    traits = replace(FedPer.traits, role="fedbabu")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.finetune_epochs = self.options.finetune_epochs
        self.finetune_part = self.options.finetune_part

    @override
    def role_config(self, client_id: int, server_round: int) -> FedBabuArgs:
        return FedBabuArgs(
            head=self.personal_groups(client_id, server_round),
            finetune_epochs=self.finetune_epochs,
            finetune_part=self.finetune_part,
        )
