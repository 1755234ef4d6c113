"""FedMD (Li and Wang: "FedMD: Heterogenous Federated Learning via Model Distillation", NeurIPS 2019
workshop; docs/methods/fedmd.md): clients of any architecture learn from each other through their
scores on a labelled set every party holds.

The labelled set is the transfer split (``dataset.transfer_fraction``, e.g. 10 % of the pooled
data, in no client's partition: the Felo/Velo paper's set-up). Each client first trains on it
(transfer learning, at its first round), and every round scores a subset of it (``subset``
samples, drawn from (seed, round) by every party alike). The server averages the round's scores
into the consensus; the next round's clients digest it (train toward it on that subset), then
train on their private data and score the new subset. No weights travel: each client keeps
its model. With 20 % of the clients a round, the consensus a client digests comes from the
previous round's clients (FedMD has every client in every round, scoring and then digesting).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from typing_extensions import override

from pflower.client_app.roles.fedmd import FEDMD, FedMDArgs

from .base.hooks import MethodTraits, Uplink
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate


def consensus(scores: Sequence[np.ndarray]) -> np.ndarray:
    """FedMD's consensus: the plain mean of the clients' scores (every client counts once)."""
    if not scores:
        raise ValueError("no scores to average")
    return np.mean(np.stack([np.asarray(s, np.float64) for s in scores]), axis=0).astype(np.float32)


@dataclass(frozen=True)
class FedMDOptions(FedMDArgs):
    """FedMD's options (``method.<name>=`` on the command line, keywords of ``FedMD(...)``),
    checked before round 1; ``pflower methods`` lists them."""


class FedMD(PersonalizedStrategy):
    """Model distillation through a consensus on shared labelled data (options: :class:`FedMDOptions`)."""

    name = "fedmd"
    options_type = FedMDOptions
    traits = MethodTraits(
        role="fedmd",
        heterogeneous=True,
        # every client's own model on the global test set at the end
        clients_evaluate_on_public=True,
        state=("consensus", "consensus_round"),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        data = self.run.client_spec.get("data")  # absent when a user's own ClientApp brings the data
        if data is not None and float(data.get("transfer_fraction", 0.0)) <= 0:
            raise ValueError(
                "fedmd needs a labelled set every party holds: set dataset.transfer_fraction (e.g. 0.1: 10 % of the "
                "pooled data, taken out of the clients' partitions)"
            )
        schema = self.model.schema()
        self.num_classes = int(schema.template[schema.group_keys[schema.groups[-1]][0]][0][0])
        self.consensus: np.ndarray | None = None
        self.consensus_round = 0

    @override
    def role_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        return {"seed": int(self.run.seed)}

    @override
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return list(self.model.schema(client_id).groups)  # no weights travel

    @override
    def extra_downlinks(
        self, client_ids: Sequence[int], server_round: int, task: str = "train"
    ) -> dict[int, dict[str, np.ndarray]]:
        if self.consensus is None or task != "train":
            return {cid: {} for cid in client_ids}
        down = {FEDMD + "consensus": self.consensus, FEDMD + "round": np.array([self.consensus_round], np.int64)}
        return {cid: dict(down) for cid in client_ids}

    @override
    def uplink(self, client_id: int, server_round: int) -> Uplink:
        scores = {FEDMD + "scores": ((self.options.subset, self.num_classes), np.dtype(np.float32))}
        return replace(super().uplink(client_id, server_round), extra=scores)

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        if not updates:
            return {}
        self.consensus = consensus([u.extra[FEDMD + "scores"] for u in updates])
        self.consensus_round = server_round
        return {"consensus_clients": len(updates)}
