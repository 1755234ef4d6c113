"""Ditto (Li et al., ICML 2021): FedAvg of a global model; each client also keeps a personal model
v trained on F(v) + lam/2 ||v - w_global||^2, and that personal model is the one evaluated."""

from __future__ import annotations

from pflower.client_app.roles.ditto import DittoArgs

from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy


class Ditto(PersonalizedStrategy):
    """A global FedAvg model and a personal model v pulled toward it.
    Its options are its client's: :class:`~pflower.client_app.roles.ditto.DittoArgs`."""

    name = "ditto"
    options_type = DittoArgs
    traits = MethodTraits(
        role="ditto",
    )
