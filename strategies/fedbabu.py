"""FedBABU (Oh et al., ICLR 2022): the head stays frozen at its (seeded) initial values and is
never sent; only the body is trained and FedAvg'd; clients fine-tune before evaluating."""

from __future__ import annotations

from typing import Any

from protocol.roles import FedBabuArgs

from .fedper import FedPer


class FedBabu(FedPer):
    """``finetune_epochs``: fine-tuning before each evaluation (official code: 5; 0 = the frozen
    head as is). ``finetune_part``: ``all`` (official code) or ``head``."""

    name = "fedbabu"
    role = "fedbabu"

    def __init__(self, *args: Any, finetune_epochs: int = 5, finetune_part: str = "all", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.finetune_epochs = int(finetune_epochs)
        self.finetune_part = finetune_part
        self.role_config(0, 1)  # a bad option fails here, before round 1

    def role_config(self, client_id: int, server_round: int) -> FedBabuArgs:
        return FedBabuArgs(
            head=self.personal_groups(client_id, server_round),
            finetune_epochs=self.finetune_epochs,
            finetune_part=self.finetune_part,
        )
