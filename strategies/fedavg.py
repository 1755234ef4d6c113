"""FedAvg (McMahan et al., 2017): one global model; optionally fine-tuned locally before evaluation."""

from __future__ import annotations

from typing import Any

from protocol.roles import SGDArgs

from .base import PersonalizedStrategy


class FedAvg(PersonalizedStrategy):
    """The whole model is shared; BN running statistics stay on each client (fedcmd.md A11).

    ``finetune_epochs > 0`` gives FedAvg-FT: each client fine-tunes a copy of the received
    model on its training split before ``test_before`` is measured.
    """

    name = "fedavg"

    heterogeneous = True  # each architecture is averaged apart (the base's aggregate)

    def __init__(self, *args: Any, finetune_epochs: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.args = SGDArgs(finetune_epochs=finetune_epochs)

    def role_config(self, client_id: int, server_round: int) -> SGDArgs:
        return self.args
