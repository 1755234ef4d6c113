"""Local-only training: every client trains its own model alone; nothing is communicated."""

from __future__ import annotations

from .base.strategy import PersonalizedStrategy


class Local(PersonalizedStrategy):
    name = "local"
    heterogeneous = True  # nothing travels: any architecture on any client

    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return list(self.schema(client_id).groups)
