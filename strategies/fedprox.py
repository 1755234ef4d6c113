"""FedProx (Li et al., MLSys 2020): FedAvg with a proximal term mu/2 ||w - w_global||^2 in local training."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from typing_extensions import override

from pflower.protocol.roles import ProximalArgs

from .base.hooks import MethodTraits
from .base.options import MethodOptions, option
from .base.strategy import PersonalizedStrategy


@dataclass(frozen=True)
class FedProxOptions(MethodOptions):
    """FedProx's options (``method.<name>=`` on the command line, keywords of ``FedProx(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    mu: float = option(1.0, "proximal weight (FedCMD/FedCPMD baselines: 1; FedTSDP recommends 0.01)", low=0)


class FedProx(PersonalizedStrategy):
    """FedAvg with a proximal term toward the received model (options: :class:`FedProxOptions`)."""

    name = "fedprox"
    options_type = FedProxOptions
    traits = MethodTraits(
        role="proximal",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.args = ProximalArgs(mu=self.options.mu)

    @override
    def role_config(self, client_id: int, server_round: int) -> ProximalArgs:
        return self.args
