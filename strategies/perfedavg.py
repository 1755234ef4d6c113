"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020): the average of the clients' MAML meta
steps, a model one gradient step away from each client's own (its role:
:mod:`pflower.client_app.roles.perfedavg`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from typing_extensions import override

from pflower.client_app.roles.perfedavg import PerFedAvgArgs
from pflower.protocol.options import option

from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate

WEIGHTS = ("uniform", "examples")


@dataclasses.dataclass(frozen=True)
class PerFedAvgOptions(PerFedAvgArgs):
    """Per-FedAvg's options: its client's, and how the server weighs the replies."""

    weights: str = option(
        "uniform",
        "uniform: each reply alike (paper, FL-bench); examples: by training examples (PFLlib)",
        choices=WEIGHTS,
    )


class PerFedAvg(PersonalizedStrategy):
    """FedAvg of the meta-trained models, uniformly weighted by default (the paper's average over
    the round's clients)."""

    name = "perfedavg"
    options_type = PerFedAvgOptions
    traits = MethodTraits(role="perfedavg")

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        if self.options.weights == "uniform":
            updates = [dataclasses.replace(u, num_examples=1) for u in updates]
        return super().aggregate(server_round, updates)
