"""MOON (Li et al., CVPR 2021): FedAvg whose clients add a model-contrastive term (client_app.roles.moon).

The server is FedAvg; the client keeps its previous local model between rounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import PersonalizedStrategy


class MOON(PersonalizedStrategy):
    """``mu``: weight of the contrastive term (paper: 5 on CIFAR-10, 1 on CIFAR-100/Tiny-ImageNet);
    ``tau``: its temperature (0.5)."""

    name = "moon"
    role = "moon"

    def __init__(self, *args: Any, mu: float = 1.0, tau: float = 0.5, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not mu >= 0 or not tau > 0:
            raise ValueError(f"MOON needs mu >= 0 and tau > 0, got mu={mu}, tau={tau}")
        self.mu, self.tau = float(mu), float(tau)

    def role_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        return {"mu": self.mu, "tau": self.tau}

    def extra_state(self) -> dict[str, Any]:
        return {}  # the server is FedAvg: its state is the base's global model

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        pass
