"""pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020): clients send their local copies w of the global
model, each pulled toward its personalized model; the server mixes their average into the global
model by beta (its role: :mod:`pflower.client_app.roles.pfedme`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from typing_extensions import override

from pflower.client_app.roles.pfedme import PFedMeArgs
from pflower.protocol.options import option

from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate


def mix_in(previous: dict[str, Any], average: dict[str, Any], beta: float) -> dict[str, Any]:
    """(1 - beta) * previous + beta * average, key by key, in each array's dtype (beta 1: the average)."""
    return {
        k: ((1 - beta) * previous[k] + beta * v).astype(v.dtype) if k in previous else v for k, v in average.items()
    }


@dataclasses.dataclass(frozen=True)
class PFedMeOptions(PFedMeArgs):
    """pFedMe's options: its client's, and the server's beta."""

    beta: float = option(
        1.0, "the global model moves by beta toward the replies' average (1: FedAvg's; peers: 1)", above=0
    )


class PFedMe(PersonalizedStrategy):
    """FedAvg of the clients' w, moved into the global model by beta."""

    name = "pfedme"
    options_type = PFedMeOptions
    traits = MethodTraits(role="pfedme")

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        previous = dict(self.model.global_arrays)
        out = super().aggregate(server_round, updates)
        if self.options.beta != 1.0:
            self.model.global_arrays.update(mix_in(previous, dict(self.model.global_arrays), self.options.beta))
        return out
