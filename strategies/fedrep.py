"""FedRep (Collins et al., ICML 2021): FedPer's split; each round the head trains first, then the body."""

from __future__ import annotations

from typing import Any

from protocol.roles import FedRepArgs

from .fedper import FedPer


class FedRep(FedPer):
    """``body_epochs`` of the E local epochs train the body, the E - body_epochs before them the head."""

    name = "fedrep"
    role = "fedrep"

    def __init__(self, *args: Any, body_epochs: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.body_epochs = int(body_epochs)
        self.role_config(0, 1)  # a bad option fails here, before round 1

    def role_config(self, client_id: int, server_round: int) -> FedRepArgs:
        return FedRepArgs(head=self.personal_groups(client_id, server_round), body_epochs=self.body_epochs)
