"""FedPer (Arivazhagan et al., 2019): the classifier stays on each client, the body is FedAvg'd."""

from __future__ import annotations

from typing_extensions import override

from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy


class FedPer(PersonalizedStrategy):
    """FedPer: the last layer group (the classifier) stays on each client; the body is FedAvg'd."""

    name = "fedper"
    traits = MethodTraits(linear_head=True)  # the last layer group is the method's classifier

    @override
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return [self.model.groups[-1]]
