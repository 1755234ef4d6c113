"""FedFomo (Zhang et al., ICLR 2021): each client combines the downloaded models that help it.

Every client keeps its own model (all groups personal) and uploads it after training; the
server stores each client's latest model and an N x N affinity matrix P. Before client i
trains it receives up to ``m`` other clients' models as extra arrays (``<client id>/<key>``):
from the pool (``pool="latest"``: the clients whose stored model is from the most recent
round that produced one, as FL-bench draws from the previous round's clients; ``"all"``:
every stored model), the ``m`` of highest P[i, j] (ties: the more recent model, then the lower
id) or, with probability ``epsilon``, ``m`` at random (epsilon-greedy exploration).
The client weights them on its validation split (:mod:`client_app.roles.fedfomo`) and
reports the raw weights, which are added to P[i, j]. FedCMD paper, hyper-parameters: M = 5, validation ratio 0.2.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from typing_extensions import override

from pflower.client_app.roles.fedfomo import FOMO_WEIGHT_METRIC, FedFomoArgs
from pflower.protocol.options import option

from .base.hooks import MethodTraits, Uplink
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate

POOLS = ("latest", "all")


@dataclass(frozen=True)
class FedFomoOptions(FedFomoArgs):
    """FedFomo's options (``method.<name>=`` on the command line, keywords of ``FedFomo(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    m: int = option(5, "models downloaded per client a round", low=1)
    pool: str = option(
        "latest", "which stored models are offered: the most recent round's uploads, or all", choices=POOLS
    )
    epsilon: float = option(0.0, "exploration: the chance of offering random models instead of the best", low=0, high=1)


class FedFomo(PersonalizedStrategy):
    """Each client keeps its own model and moves toward the peers' models that lower its
    validation loss (options: :class:`FedFomoOptions`)."""

    name = "fedfomo"
    options_type = FedFomoOptions
    traits = MethodTraits(
        role="fedfomo",
        state=("models", "model_round", "affinity", "offered", "explore"),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.m, self.val_ratio, self.pool, self.epsilon = o.m, o.val_ratio, o.pool, o.epsilon
        self.models: dict[int, dict[str, np.ndarray]] = {}  # latest uploaded model of each client
        self.model_round: dict[int, int] = {}  # the round it was uploaded in
        self.affinity = np.zeros((self.run.num_clients, self.run.num_clients))
        self.offered: dict[int, list[int]] = {}  # the models sent to each client this round
        self.explore = np.random.default_rng([self.run.seed, 1])  # its own stream: sampling stays method-independent

    @override
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return list(self.model.groups)

    @override
    def uplink(self, client_id: int, server_round: int) -> Uplink:
        return Uplink(self.model.groups)

    def choose(self, client_id: int) -> list[int]:
        """The clients whose models client ``client_id`` downloads this round (vectorized: O(N log N) in numpy)."""
        ids = np.fromiter(self.models, dtype=np.int64, count=len(self.models))
        rounds = np.fromiter((self.model_round[j] for j in self.models), dtype=np.int64, count=len(ids))
        keep = ids != client_id
        if self.pool == "latest" and keep.any():
            keep &= rounds == rounds[keep].max()
        pool, pool_rounds = ids[keep], rounds[keep]
        if len(pool) <= self.m:
            return sorted(pool.tolist())
        if self.epsilon > 0 and self.explore.random() < self.epsilon:
            return sorted(int(j) for j in self.explore.choice(pool.tolist(), size=self.m, replace=False))
        ranked = np.lexsort((pool, -pool_rounds, -self.affinity[client_id, pool]))  # affinity, then recency, then id
        return sorted(pool[ranked[: self.m]].tolist())

    @override
    def extra_downlinks(
        self, client_ids: Sequence[int], server_round: int, task: str = "train"
    ) -> dict[int, dict[str, np.ndarray]]:
        """The chosen peers' models, as extra arrays ``<peer id>/<key>``."""
        if task != "train":  # the final evaluation needs none
            return {cid: {} for cid in client_ids}
        out = {}
        for cid in client_ids:
            self.offered[cid] = self.choose(cid)
            out[cid] = {f"{j}/{k}": v for j in self.offered[cid] for k, v in self.models[j].items()}
        return out

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        helpful = []
        for u in updates:
            for j in self.offered.get(u.client_id, []):
                if f"{FOMO_WEIGHT_METRIC}{j}" in u.metrics:
                    self.affinity[u.client_id, j] += u.metrics[f"{FOMO_WEIGHT_METRIC}{j}"]
                    helpful.append(u.metrics[f"{FOMO_WEIGHT_METRIC}{j}"] > 0)
        for u in updates:  # stored after the affinity update: the round's models are next round's pool
            self.models[u.client_id] = u.arrays
            self.model_round[u.client_id] = server_round
        self.offered = {}
        record: dict[str, Any] = {"stored_models": len(self.models)}
        if helpful:
            record["helpful_share"] = float(np.mean(helpful))
        return record
