"""FedProx (Li et al., MLSys 2020): FedAvg with a proximal term mu/2 ||w - w_global||^2 in local training."""

from __future__ import annotations

from pflower.client_app.roles.proximal import ProximalArgs

from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy


class FedProx(PersonalizedStrategy):
    """FedAvg with a proximal term toward the received model.
    Its options are its client's: :class:`~pflower.client_app.roles.proximal.ProximalArgs`."""

    name = "fedprox"
    options_type = ProximalArgs
    traits = MethodTraits(
        role="proximal",
    )
