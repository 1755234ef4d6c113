"""FedRep (Collins et al., ICML 2021): FedPer's split; each round the head trains first, then the body."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from typing_extensions import override

from pflower.protocol.roles import FedRepArgs

from .base.options import MethodOptions, option
from .fedper import FedPer


@dataclass(frozen=True)
class FedRepOptions(MethodOptions):
    """FedRep's options (``method.<name>=`` on the command line, keywords of ``FedRep(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    body_epochs: int = option(
        1, "of the E local epochs, the last ones that train the body (the ones before train the head)", low=0
    )


class FedRep(FedPer):
    """FedPer whose local epochs train the head, then the body (options: :class:`FedRepOptions`)."""

    name = "fedrep"
    options_type = FedRepOptions
    traits = replace(FedPer.traits, role="fedrep")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.body_epochs = self.options.body_epochs

    @override
    def role_config(self, client_id: int, server_round: int) -> FedRepArgs:
        return FedRepArgs(head=self.personal_groups(client_id, server_round), body_epochs=self.body_epochs)
