"""FedBABU (Oh et al., ICLR 2022): the head stays frozen at its (seeded) initial values and is
never sent; only the body is trained and FedAvg'd; clients fine-tune before evaluating."""

from __future__ import annotations

from typing import Any

from client_app.roles.fedbabu import FINETUNE_PARTS

from .fedper import FedPer


class FedBabu(FedPer):
    """``finetune_epochs``: fine-tuning before each evaluation (official code: 5; 0 = the frozen
    head as is). ``finetune_part``: ``all`` (official code) or ``head``."""

    name = "fedbabu"
    role = "fedbabu"

    def __init__(self, *args: Any, finetune_epochs: int = 5, finetune_part: str = "all", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if finetune_epochs < 0:
            raise ValueError(f"FedBabu finetune_epochs must be >= 0, got {finetune_epochs}")
        if finetune_part not in FINETUNE_PARTS:
            raise ValueError(f"FedBabu finetune_part must be one of {list(FINETUNE_PARTS)}, got {finetune_part!r}")
        self.finetune_epochs = int(finetune_epochs)
        self.finetune_part = finetune_part

    def role_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        return {
            "head": self.personal_groups(client_id, server_round),
            "finetune_epochs": self.finetune_epochs,
            "finetune_part": self.finetune_part,
        }
