"""APFL (Deng, Kamani, Mahdavi, 2020): FedAvg of the global model; each client mixes it with a
personal model by a weight it learns (its role: :mod:`pflower.client_app.roles.apfl`)."""

from __future__ import annotations

from pflower.client_app.roles.apfl import APFLArgs

from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy


class APFL(PersonalizedStrategy):
    """The server is FedAvg's over the global model w; each client's personal model v and its
    mixing weight alpha are client state. Its options are its client's:
    :class:`~pflower.client_app.roles.apfl.APFLArgs`."""

    name = "apfl"
    options_type = APFLArgs
    traits = MethodTraits(role="apfl")
