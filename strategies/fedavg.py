"""FedAvg (McMahan et al., 2017): one global model; optionally fine-tuned locally before evaluation."""

from __future__ import annotations

from pflower.client_app.roles.base import SGDArgs

from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy


class FedAvg(PersonalizedStrategy):
    """The whole model is shared; BN running statistics stay on each client (as in the FedCMD paper's
    FedAvg baseline). ``finetune_epochs > 0`` gives FedAvg-FT.
    Its options are its client's: :class:`~pflower.client_app.roles.base.SGDArgs`."""

    name = "fedavg"
    options_type = SGDArgs
    traits = MethodTraits(heterogeneous=True)  # each architecture is averaged apart (the base's aggregate)
