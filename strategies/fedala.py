"""FedALA (Zhang et al., AAAI 2023): FedAvg on the server; each client mixes the global model into
its own local one with element-wise weights it learns before training (its role:
:mod:`pflower.client_app.roles.fedala`)."""

from __future__ import annotations

from pflower.client_app.roles.fedala import FedALAArgs

from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy


class FedALA(PersonalizedStrategy):
    """The server is FedAvg's; the adaptive local aggregation and each client's local model are the
    client's. Its options are its client's: :class:`~pflower.client_app.roles.fedala.FedALAArgs`."""

    name = "fedala"
    options_type = FedALAArgs
    traits = MethodTraits(role="fedala")
