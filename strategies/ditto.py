"""Ditto (Li et al., ICML 2021): FedAvg of a global model; each client also keeps a personal model
v trained on F(v) + lam/2 ||v - w_global||^2, and that personal model is the one evaluated."""

from __future__ import annotations

from typing import Any

from protocol.roles import DittoArgs

from .base import PersonalizedStrategy


class Ditto(PersonalizedStrategy):
    """``lam``: the pull toward the global model (FedTSDP recommends 0.1); ``personal_epochs``:
    epochs on v per round (None: the run's local_epochs)."""

    name = "ditto"
    role = "ditto"

    def __init__(self, *args: Any, lam: float = 0.1, personal_epochs: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.args = DittoArgs(lam=float(lam), personal_epochs=personal_epochs)

    def role_config(self, client_id: int, server_round: int) -> DittoArgs:
        return self.args
