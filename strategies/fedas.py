"""FedAS (Yang, Huang, Ye, CVPR 2024): each client aligns the received extractor to its own class
prototypes before training (parameter alignment), and the server averages the replies weighted
by the trace of each one's Fisher information instead of its examples (client synchronization;
its role: :mod:`pflower.client_app.roles.fedas`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from typing_extensions import override

from pflower.client_app.roles.fedas import FedASArgs

from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate
from .shared.aggregation import fedavg


def fisher_weights(traces: Sequence[float], num_examples: Sequence[int]) -> list[float]:
    """The aggregation weights: the Fisher traces, normalised (by examples where every trace is 0)."""
    traces = [max(float(t), 0.0) for t in traces]
    total = sum(traces)
    return [t / total for t in traces] if total > 0 else [n / sum(num_examples) for n in num_examples]


class FedAS(PersonalizedStrategy):
    """FedAvg weighted by the replies' Fisher traces; the classifier stays on the clients under
    ``head=personal``. Its options are its client's: :class:`~pflower.client_app.roles.fedas.FedASArgs`."""

    name = "fedas"
    options_type = FedASArgs
    traits = MethodTraits(role="fedas", linear_head=True)

    @override
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return [self.model.schema(client_id).groups[-1]] if self.options.head == "personal" else []

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        by_arch: dict[str, list[ClientUpdate]] = {}
        for u in updates:
            if u.arrays:
                by_arch.setdefault(self.model.arch_of[u.client_id], []).append(u)
        missing = [u.client_id for ups in by_arch.values() for u in ups if "fim_trace" not in u.metrics]
        if missing:
            raise ValueError(
                f"fedas: the replies of clients {missing} carry no fim_trace: server and client pflower differ"
            )
        shares = []
        for arch, ups in by_arch.items():
            weights = fisher_weights([u.metrics["fim_trace"] for u in ups], [u.num_examples for u in ups])
            self.model.arrays[arch].update(fedavg([u.arrays for u in ups], weights))
            shares.append(max(weights))
        return {"largest_weight": float(np.max(shares)), "log_keys": ["largest_weight"]} if shares else {}
