"""FedRep (Collins et al., ICML 2021): FedPer's split; each round the head trains first, then the body."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from typing_extensions import override

from pflower.client_app.roles.fedrep import FedRepArgs

from .fedper import FedPer


class FedRep(FedPer):
    """FedPer whose local epochs train the head, then the body (options: its client's,
    :class:`~pflower.client_app.roles.fedrep.FedRepArgs`)."""

    name = "fedrep"
    options_type = FedRepArgs
    traits = replace(FedPer.traits, role="fedrep")

    @override
    def role_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        return {"head": self.personal_groups(client_id, server_round)}
