"""CFL, clustered federated learning (Sattler et al., IEEE TNNLS 2021).

Every cluster has its own model (one cluster of all clients at first: FedAvg). A client
receives its cluster's model and sends back its trained model; the server computes the
updates dW_i = w_i - theta_c. A cluster whose round participants have stopped improving it
together while some of them still move a lot,

    || sum_i n_i/n dW_i || < eps1   and   max_i ||dW_i|| > eps2,

(and that has more than ``min_cluster_size`` members and participants this round, from round
``start_round`` on) is split in two by :func:`bipartition` of the cosine similarities of the
participants' updates.
Both halves start from the cluster's model plus their own members' mean update; clusters are
split recursively in later rounds. Each cluster's model is the FedAvg of its participants
(theta_c + sum_i n_i/n dW_i, Algorithm 1).

Partial participation (the paper lets every client train every round): a member that did not
train this round joins the half whose members' updates were most similar to its own, on
average, the last time they were in the same round (a persistent N x N similarity matrix, as
in pFedSim); one with no such history joins the larger half.
Defaults are the reference code's: eps1 = 0.4, eps2 = 1.6, clusters of more than 2 members,
splits from round 20.

Units. The paper reads a weight update as a gradient approximation (dW ~ -lr * grad), and its
thresholds are fixed numbers; under a decaying learning-rate schedule every update shrinks with
the rate, so fixed thresholds become unreachable (FedTSDP's FMNIST set-up, lr x0.95 a round:
the largest update fell from 1.27 to 0.45 by round 21 and CFL never split). With
``lr_normalized`` (default) both norms are rescaled to the run's base rate, ||dW|| * lr_0 / lr_r,
before the comparison; under a constant rate nothing changes. The thresholds themselves are in
the units of the model and the local training: eps2 must lie above the largest update of
clients that share one distribution (the paper's condition that the stationary point leaves
only noise for congruent clients) and below that of incongruent ones. ``docs/methods/cfl.md``
gives the calibration for the leaderboard's FMNIST protocol, from logged norms.

Every round with at least two participants in a cluster logs the bi-partition it would make:
``cross_cos_max``, the largest cosine between updates on the two sides (the paper's
alpha_cross_max; low or negative when the halves pull apart), whether or not it splits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from logging import INFO
from typing import Any

import numpy as np
from flwr.common import log
from typing_extensions import override

from pflower.protocol.options import MethodOptions, option

from .base.diagnostics import Panel
from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate
from .shared.clustering import bipartition, cross_cosine_max
from .shared.clusters import Clusters, cluster_fedavg
from .shared.model_distance import update_statistics
from .shared.similarity import cosine_from_gram


@dataclass(frozen=True)
class CFLOptions(MethodOptions):
    """CFL's options (``method.<name>=`` on the command line, keywords of ``CFL(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    eps1: float = option(0.4, "split when the norm of the mean update falls below this", low=0)
    eps2: float = option(1.6, "... and the largest update norm rises above this", low=0)
    min_cluster_size: int = option(
        2, "only a cluster with more members (and more participants in the round) splits", low=1
    )
    start_round: int = option(20, "no split before this round", low=0)
    lr_normalized: bool = option(True, "compare update norms rescaled to the base learning rate")


class CFL(PersonalizedStrategy):
    """Clustered FL: one model per cluster, a cluster splits in two when its clients' updates
    diverge (options: :class:`CFLOptions`)."""

    name = "cfl"
    options_type = CFLOptions
    traits = MethodTraits(
        diagnostic_panels=(
            Panel("max_update_norm", "largest update norm", threshold="eps2", events="splits"),
            Panel("mean_update_norm", "norm of the mean update", threshold="eps1"),
            Panel("num_clusters", "clusters"),
        ),
        state=("clusters", "sim", "split_rounds"),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.eps1, self.eps2, self.min_cluster_size, self.start_round = (
            o.eps1,
            o.eps2,
            o.min_cluster_size,
            o.start_round,
        )
        self.lr_normalized = o.lr_normalized
        self.split_rounds: list[int] = []
        self.clusters = Clusters.single(range(self.run.num_clients), self.model.global_arrays)
        self.sim = np.full((self.run.num_clients, self.run.num_clients), np.nan)  # update cosines, last shared round

    @override
    def downlinks(self, client_ids: Sequence[int], server_round: int) -> dict[int, dict[str, np.ndarray]]:
        out = {}
        for cid in client_ids:
            model = self.clusters.model_of(cid)
            out[cid] = {k: model[k] for k in self.model.keys(client_id=cid)}
        return out

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        keys = list(self.model.global_arrays)
        clusters, models = [], []
        mean_norms, max_norms, cross, splits = [], [], [], 0
        scale = 1.0 / self.run.lr_schedule.lr(1.0, server_round) if self.lr_normalized else 1.0
        by_cluster = self.clusters.group(updates)
        for c, members in enumerate(self.clusters.members):
            ups = by_cluster.get(c, [])
            if not ups:
                clusters.append(members)
                models.append(self.clusters.models[c])
                continue
            halves = [(members, ups)]
            if len(ups) >= 2:
                # Gram matrix of the updates dW_i and ||mean dW||, without building the dW_i
                gram, mean_norm = update_statistics(
                    [u.arrays for u in ups], self.clusters.models[c], [u.num_examples for u in ups], keys
                )
                cos = cosine_from_gram(gram)
                ids = [u.client_id for u in ups]
                self.sim[np.ix_(ids, ids)] = cos
                mean_norm, max_norm = scale * mean_norm, scale * float(np.sqrt(np.diag(gram).max()))
                mean_norms.append(mean_norm)
                max_norms.append(max_norm)
                cross.append(cross_cosine_max(cos, bipartition(cos)))
                if (
                    server_round >= self.start_round
                    and min(len(members), len(ups)) > self.min_cluster_size
                    and mean_norm < self.eps1
                    and max_norm > self.eps2
                ):
                    halves = self._split(members, ups, cos)
                    splits += 1
                    self.split_rounds.append(server_round)
                    log(INFO, "CFL round %d: cluster %s split into %s", server_round, members, [h[0] for h in halves])
            for half_members, half_ups in halves:
                clusters.append(half_members)
                models.append(cluster_fedavg(half_ups))
        self.clusters = Clusters(clusters, models)
        record: dict[str, Any] = {"num_clusters": len(clusters), "clusters": self.clusters.members, "splits": splits}
        record["log_keys"] = ["num_clusters"]
        if mean_norms:
            record.update(
                {"mean_update_norm": min(mean_norms), "max_update_norm": max(max_norms), "cross_cos_max": min(cross)}
            )
        return record

    def _split(self, members: list[int], ups: Sequence[ClientUpdate], cos: np.ndarray) -> list[tuple[list[int], list]]:
        """The two halves (members, their updates) of a cluster split by its participants' cosines."""
        first, second = bipartition(cos)
        sides = [[ups[i] for i in first], [ups[i] for i in second]]
        groups = [[u.client_id for u in side] for side in sides]
        trained = {u.client_id for u in ups}
        for k in (m for m in members if m not in trained):
            affinity = [np.nanmean(self.sim[k, g]) if np.any(~np.isnan(self.sim[k, g])) else np.nan for g in groups]
            if np.all(np.isnan(affinity)):
                side = 0 if len(groups[0]) >= len(groups[1]) else 1
            else:
                side = int(np.nanargmax(affinity))
            groups[side].append(k)
        return [(sorted(g), side) for g, side in zip(groups, sides)]

    @override
    def run_summary(self) -> dict[str, Any]:
        return {
            "clusters": self.clusters.members,
            "num_clusters": len(self.clusters),
            "split_rounds": list(self.split_rounds),
        }
