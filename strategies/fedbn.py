"""FedBN (Li et al., ICLR 2021): FedAvg in which BatchNorm parameters and statistics never leave a client.

BN running statistics stay local for every pflower method; FedBN also keeps the BN affine
parameters (gamma, beta), which sit inside the conv groups, so they are personal *keys*
(:meth:`PersonalizedStrategy.personal_keys`), not a personal group. A model without BN
(VGG11) makes FedBN plain FedAvg.
"""

from __future__ import annotations

from logging import WARNING
from typing import Any

from flwr.common import log
from typing_extensions import override

from .base.strategy import PersonalizedStrategy


class FedBN(PersonalizedStrategy):
    """FedBN: FedAvg with every BatchNorm parameter and statistic kept on its client (module docstring)."""

    name = "fedbn"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bn_keys = list(self.model.schema().bn_params)
        if not self.bn_keys:
            log(WARNING, "FedBN: the model has no BatchNorm layer; FedBN is FedAvg here")

    @override
    def personal_keys(self, client_id: int, server_round: int) -> list[str]:
        return list(self.bn_keys)
