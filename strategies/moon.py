"""MOON (Li et al., CVPR 2021): FedAvg whose clients add a model-contrastive term (client_app.roles.moon).

The server is FedAvg; the client keeps its previous local model between rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from typing_extensions import override

from pflower.protocol.roles import MOONArgs

from .base.hooks import MethodTraits
from .base.options import MethodOptions, option
from .base.strategy import PersonalizedStrategy


@dataclass(frozen=True)
class MOONOptions(MethodOptions):
    """MOON's options (``method.<name>=`` on the command line, keywords of ``MOON(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    mu: float = option(
        1.0, "weight of the contrastive term (paper: 5 on CIFAR-10, 1 on CIFAR-100/Tiny-ImageNet)", low=0
    )
    tau: float = option(0.5, "temperature of the contrastive term", above=0)


class MOON(PersonalizedStrategy):
    """FedAvg with a model-contrastive term in the local loss (options: :class:`MOONOptions`)."""

    name = "moon"
    options_type = MOONOptions
    traits = MethodTraits(
        # the last layer group is the method's classifier
        linear_head=True,
        role="moon",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.args = MOONArgs(mu=self.options.mu, tau=self.options.tau)

    @override
    def role_config(self, client_id: int, server_round: int) -> MOONArgs:
        return self.args
