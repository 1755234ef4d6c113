"""FedRoD (Chen & Chao, ICLR 2022): FedAvg of a body and a generic head trained on the balanced
softmax, and a personalized head that never leaves its client (its role:
:mod:`pflower.client_app.roles.fedrod`)."""

from __future__ import annotations

from pflower.client_app.roles.fedrod import FedRoDArgs

from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy


class FedRoD(PersonalizedStrategy):
    """The server is FedAvg's over the whole model (the body and the generic head): the personal
    head is client state, not a layer group. Its options are its client's:
    :class:`~pflower.client_app.roles.fedrod.FedRoDArgs`."""

    name = "fedrod"
    options_type = FedRoDArgs
    traits = MethodTraits(role="fedrod", linear_head=True)  # the personal head is a copy of the classifier
