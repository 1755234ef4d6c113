"""FedAvg (McMahan et al., 2017): one global model; optionally fine-tuned locally before evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from typing_extensions import override

from pflower.protocol.roles import SGDArgs

from .base.hooks import MethodTraits
from .base.options import MethodOptions, option
from .base.strategy import PersonalizedStrategy


@dataclass(frozen=True)
class FedAvgOptions(MethodOptions):
    """FedAvg's options (``method.<name>=`` on the command line, keywords of ``FedAvg(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    finetune_epochs: int = option(
        0, "epochs of fine-tuning a copy of the received model before test_before (FedAvg-FT)", low=0
    )


class FedAvg(PersonalizedStrategy):
    """The whole model is shared; BN running statistics stay on each client (as in the FedCMD paper's
    FedAvg baseline). ``finetune_epochs > 0`` gives FedAvg-FT (options: :class:`FedAvgOptions`)."""

    name = "fedavg"
    options_type = FedAvgOptions
    traits = MethodTraits(heterogeneous=True)  # each architecture is averaged apart (the base's aggregate)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.args = SGDArgs(finetune_epochs=self.options.finetune_epochs)

    @override
    def role_config(self, client_id: int, server_round: int) -> SGDArgs:
        return self.args
