"""Local-only training: every client trains its own model alone; nothing is communicated."""

from __future__ import annotations

from typing_extensions import override

from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy


class Local(PersonalizedStrategy):
    """Every client trains its own model alone: the baseline a personalized method must beat."""

    name = "local"
    traits = MethodTraits(heterogeneous=True)  # nothing travels: any architecture on any client

    @override
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return list(self.model.schema(client_id).groups)
