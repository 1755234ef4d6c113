"""FedRep (Collins et al., ICML 2021): FedPer's split; each round the head trains first, then the body."""

from __future__ import annotations

from typing import Any

from .fedper import FedPer


class FedRep(FedPer):
    """``body_epochs`` of the E local epochs train the body, the E - body_epochs before them the head."""

    name = "fedrep"
    role = "fedrep"

    def __init__(self, *args: Any, body_epochs: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if body_epochs < 0:
            raise ValueError(f"FedRep body_epochs must be >= 0, got {body_epochs}")
        self.body_epochs = int(body_epochs)

    def role_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        return {"head": self.personal_groups(client_id, server_round), "body_epochs": self.body_epochs}
