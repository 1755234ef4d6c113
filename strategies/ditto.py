"""Ditto (Li et al., ICML 2021): FedAvg of a global model; each client also keeps a personal model
v trained on F(v) + lam/2 ||v - w_global||^2, and that personal model is the one evaluated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from typing_extensions import override

from pflower.protocol.roles import DittoArgs

from .base.hooks import MethodTraits
from .base.options import MethodOptions, option
from .base.strategy import PersonalizedStrategy


@dataclass(frozen=True)
class DittoOptions(MethodOptions):
    """Ditto's options (``method.<name>=`` on the command line, keywords of ``Ditto(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    lam: float = option(0.1, "pull of the personal model toward the global one (FedTSDP recommends 0.1)", low=0)
    personal_epochs: int | None = option(
        None, "epochs on the personal model a round (null: the run's local_epochs)", low=0
    )


class Ditto(PersonalizedStrategy):
    """A global FedAvg model and a personal model v pulled toward it (options: :class:`DittoOptions`)."""

    name = "ditto"
    options_type = DittoOptions
    traits = MethodTraits(
        role="ditto",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.args = DittoArgs(lam=self.options.lam, personal_epochs=self.options.personal_epochs)

    @override
    def role_config(self, client_id: int, server_round: int) -> DittoArgs:
        return self.args
