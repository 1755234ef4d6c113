"""FedBABU (Oh et al., ICLR 2022): the head stays frozen at its (seeded) initial values and is
never sent; only the body is trained and FedAvg'd; clients fine-tune before evaluating."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from typing_extensions import override

from pflower.client_app.roles.fedbabu import FedBabuArgs

from .fedper import FedPer


class FedBabu(FedPer):
    """FedPer with the head frozen at its seeded init and fine-tuned before evaluation (options:
    its client's, :class:`~pflower.client_app.roles.fedbabu.FedBabuArgs`)."""

    name = "fedbabu"
    options_type = FedBabuArgs
    traits = replace(FedPer.traits, role="fedbabu")

    @override
    def role_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        return {"head": self.personal_groups(client_id, server_round)}
