"""FedPer (Arivazhagan et al., 2019): the classifier stays on each client, the body is FedAvg'd."""

from __future__ import annotations

from .base.strategy import PersonalizedStrategy


class FedPer(PersonalizedStrategy):
    name = "fedper"

    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return [self.groups[-1]]
