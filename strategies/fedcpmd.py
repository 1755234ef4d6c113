"""FedCPMD (Du et al., Chinese Journal of Computers 2025): a personal layer per client, clusters by layer.

Phase 1, cluster preparation (rounds 1..Kp, FedCPMD paper, cluster preparation (Alg. 2)): FedPer-style rounds (the
classifier stays on each client, the body is FedAvg'd) in which every client scores the
candidate layers with the layer-wise knowledge representation (FedCMD's scorer under FedCPMD's
rule: JS, W2, Hellinger or Bhattacharyya between 1-D Gaussian fits) and sends its round vote.
Phase 1 runs on until every client has voted at least once, for at most ``k_extra`` more rounds;
a client that still has not is probed at its first phase-2 contact (a vote-only pass).

Clustering (FedCPMD paper): each client's layer l*_i is its most frequent vote (ties: the most recent of
the tied); clients with the same layer form a cluster. A cluster's starting body is the phase-1
global body, with the classifier (if it is no longer personal there) the n-weighted mean of the
members' last phase-1 classifiers. Each client keeps its own trained l*_i (the clients
keep their whole models, so no layer reverts to its seeded value).

Phase 2 (FedCPMD paper): the clusters run side by side in every round, each sampling its own clients
(``cluster_fit_count``: the reference code's |M| if |M| <= 5 else max(5, ceil(gamma |M|)), or the
paper's max(1, round(gamma |M|))). Nothing is ever aggregated across clusters. Inside a cluster,
each participant's stored body is the average of the participants' bodies weighted by the
clipped cosine similarity of their personal layers (Eq. 12-13; FedCMD's Eq. 7-8 code), and the
cluster body (sent to members without a stored one) is their FedAvg (Eq. 5). ``fedcmd_split``
FedAvgs the layers before l* instead.

Ablations (Fig. 5): ``only_cluster`` (clusters from the votes, FedAvg of the whole model inside
each, no personal layer) and ``only_decoupling`` (each client keeps its own layer, one federation:
every other tensor is FedAvg'd over the participants for which it is not personal).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.common import log
from typing_extensions import override

from pflower.client_app.roles.fedcpmd import FedCPMDArgs
from pflower.protocol.options import option

from .base.evaluation import weighted_test_metrics
from .base.hooks import MethodTraits, Uplink
from .base.phases import phase_rounds
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate
from .fedcmd import default_candidates
from .fedcmd_math import personalized_posts
from .shared.aggregation import fedavg
from .shared.clustering import groups_by_label
from .shared.clusters import Clusters, cluster_fedavg
from .shared.model_distance import gram_matrix
from .shared.similarity import EQ8_EPS, cosine_from_gram

FIT_COUNTS = ("refcode", "paper")
ABLATIONS = (None, "only_cluster", "only_decoupling")


def cluster_sample_size(members: int, gamma: float, rule: str = "refcode") -> int:
    """Clients a cluster of ``members`` trains per round (docs/methods/fedcpmd.md: the reference code's rule or the
    paper's)."""
    if rule == "refcode":
        return members if members <= 5 else max(5, math.ceil(gamma * members))
    return min(members, max(1, round(gamma * members)))


def personal_layer_of(votes: Sequence[tuple[int, str]]) -> str | None:
    """l*_i: the client's most frequent vote; ties go to the most recent of the tied (FedCPMD paper)."""
    if not votes:
        return None
    counts = Counter(layer for _, layer in votes)
    top = max(counts.values())
    return max((rnd, layer) for rnd, layer in votes if counts[layer] == top)[1]


@dataclass(frozen=True)
class FedCPMDOptions(FedCPMDArgs):
    """FedCPMD's options (``method.<name>=`` on the command line, keywords of ``FedCPMD(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    kp: int = option(60, "Kp, the rounds of phase 1 (votes; at least 1); the paper: 60 of 200", low=0)
    rho: float | None = option(None, "Kp as a share of total_rounds (overrides kp)", low=0, high=1)
    total_rounds: int | None = option(None, "K, the run's rounds (the method config sets it to rounds)", low=1)
    k_extra: int = option(20, "phase 1 goes on until every client voted, for at most this many more rounds", low=0)
    cluster_fit_count: str = option(
        "refcode", "clients trained a phase-2 round: the authors' code's count, or the paper's", choices=FIT_COUNTS
    )
    fedcmd_split: bool = option(
        False, "inside a cluster, FedAvg the layers before l* (FedCMD's split) instead of the similarity mix"
    )
    ablation: str | None = option(
        None, "the paper's ablations: only_cluster, only_decoupling (null: the method)", choices=ABLATIONS
    )


class FedCPMD(PersonalizedStrategy):
    """FedCPMD on the strategy base (options: :class:`FedCPMDOptions`; the algorithm: the module docstring)."""

    name = "fedcpmd"
    options_type = FedCPMDOptions
    traits = MethodTraits(
        # the last layer group is the method's classifier
        linear_head=True,
        role="fedcpmd",
        # a layer shared in phase 1 and personal in phase 2 keeps the client's own value
        client_keeps="model",
        state=(
            "votes",
            "last_cls",
            "n_train",
            "phase1_end",
            "layer_of",
            "clusters",
            "cluster_layers",
            "bodies",
            "probed",
            "extension_logged",
        ),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.kp = phase_rounds("FedCPMD kp", None if o.rho is not None else o.kp, o.rho, o.total_rounds, "round", "rho")
        if self.kp < 1:
            raise ValueError("FedCPMD needs kp >= 1 phase-1 rounds: the clusters come from the phase-1 votes")
        if o.total_rounds is not None and self.kp >= o.total_rounds:
            raise ValueError(
                f"FedCPMD kp={self.kp} leaves no phase-2 round in a run of {o.total_rounds} rounds: "
                f"set method.kp below rounds (the paper: kp=60 of 200), or method.rho"
            )
        cands = list(o.candidates) if o.candidates else default_candidates(self.model.groups)
        if any(c not in self.model.groups for c in cands) or len(set(cands)) != len(cands):
            raise ValueError(f"FedCPMD candidates {cands} must be distinct groups of the model {self.model.groups}")
        self.k_extra = o.k_extra
        self.candidates = [g for g in self.model.groups if g in cands]
        self.cluster_fit_count, self.fedcmd_split, self.ablation = o.cluster_fit_count, o.fedcmd_split, o.ablation
        self.votes: dict[int, list[tuple[int, str]]] = {}  # client -> its (round, layer) votes
        self.last_cls: dict[int, dict[str, np.ndarray]] = {}  # client -> its last phase-1 classifier
        self.n_train: dict[int, int] = {}
        self.phase1_end: int | None = None  # K_p': the last phase-1 round, fixed at the switch
        self.layer_of: dict[int, str] = {}  # client -> its personal layer l*_i
        self.clusters: Clusters | None = None  # members by layer; models: the cluster bodies omega_m
        self.cluster_layers: list[str] = []
        body_bytes = sum(
            int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in self.model.template.values()
        )
        self.bodies = self.run.client_store("bodies", body_bytes)  # client -> its stored personalized body (Eq. 12)
        self.probed: list[int] = []
        self.extension_logged = False
        self._probing: set[int] = set()

    # ------------------------------------------------------------------ phases
    def phase(self, server_round: int) -> int:
        """1 while clients vote (Kp rounds, longer until every client has voted), then 2: clustered FL."""
        return 1 if self.phase1_end is None or server_round <= self.phase1_end else 2

    def unvoted(self) -> list[int]:
        """The clients without a vote yet: phase 1 runs on for them (up to k_extra rounds)."""
        return sorted(set(range(self.run.num_clients)) - set(self.votes))

    def _continue_phase1(self, server_round: int) -> bool:
        """Phase 1 goes on in ``server_round``: within Kp, or while clients have not voted (<= Kp + k_extra)."""
        if server_round <= self.kp:
            return True
        missing = self.unvoted()
        if missing and server_round <= self.kp + self.k_extra:
            if not self.extension_logged:
                log(
                    WARNING,
                    "FedCPMD: phase 1 extended past Kp=%d: %d client(s) have not voted yet (%s)",
                    self.kp,
                    len(missing),
                    missing[:10],
                )
                self.extension_logged = True
            return True
        return False

    def _switch(self, server_round: int) -> None:
        """End phase 1 after round ``server_round - 1``: personal layers and clusters (FedCPMD paper)."""
        self.phase1_end = server_round - 1
        self.layer_of = {c: personal_layer_of(v) for c, v in self.votes.items() if personal_layer_of(v)}
        if self.ablation == "only_decoupling":
            log(
                INFO,
                "FedCPMD (only_decoupling): after %d phase-1 rounds, personal layers %s",
                self.phase1_end,
                dict(Counter(self.layer_of.values())),
            )
            return
        members = groups_by_label(self.layer_of)
        self.cluster_layers = [self.layer_of[m[0]] for m in members]
        self.clusters = Clusters(
            members, [self._cluster_start(m, layer) for m, layer in zip(members, self.cluster_layers)]
        )
        log(
            INFO,
            "FedCPMD: after %d phase-1 rounds, clusters %s",
            self.phase1_end,
            [f"{layer}: {len(m)}" for layer, m in zip(self.cluster_layers, members)],
        )

    def _cluster_start(self, members: Sequence[int], layer: str) -> dict[str, np.ndarray]:
        """omega_m: the phase-1 global body, and the members' mean classifier where it is shared now."""
        shared = self.cluster_groups(layer)
        model = {
            k: self.model.global_arrays[k].copy() for k in self.model.keys([g for g in shared if g != self.classifier])
        }
        if self.classifier in shared:
            held = [c for c in members if c in self.last_cls]
            if held:
                model.update(fedavg([self.last_cls[c] for c in held], [self.n_train[c] for c in held]))
            else:
                model.update({k: self.model.global_arrays[k].copy() for k in self.model.keys([self.classifier])})
        return model

    @property
    def classifier(self) -> str:
        """The classifier: the model's last layer group ("classifier" in the zoo)."""
        return self.model.groups[-1]

    def cluster_groups(self, layer: str) -> list[str]:
        """The groups a cluster of ``layer`` shares (all but the layer; all under only_cluster)."""
        return (
            list(self.model.groups) if self.ablation == "only_cluster" else [g for g in self.model.groups if g != layer]
        )

    # ------------------------------------------------------------------ hooks
    @override
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        if self.phase(server_round) == 1 or client_id not in self.layer_of or client_id in self._probing:
            return [self.classifier]  # the classifier is every client's personal layer in phase 1
        return [] if self.ablation == "only_cluster" else [self.layer_of[client_id]]

    @override
    def uplink(self, client_id: int, server_round: int) -> Uplink:
        if client_id in self._probing:
            return Uplink([])  # a vote-only probe sends nothing back but its vote
        if self.phase(server_round) == 2 and self.ablation == "only_decoupling":
            return super().uplink(client_id, server_round)
        return Uplink(self.model.groups)  # phase 1: the classifier is stored; phase 2: phi for Eq. 13

    @override
    def role_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        phase = 0 if client_id in self._probing else self.phase(server_round)
        return {"candidates": self.candidates, "phase": phase}  # candidates: null resolved to the FC groups

    def sample(self, server_round: int) -> list[int]:
        """Phase 1: the run's uniform draw. Phase 2: each cluster draws its own clients."""
        if self.clusters is None or self.phase(server_round) == 1:
            return super().sample(server_round)
        out: list[int] = []
        for members in self.clusters.members:
            out += self.run.draw(members, cluster_sample_size(len(members), self.run.fraction, self.cluster_fit_count))
        return sorted(out)

    def downlinks(self, client_ids: Sequence[int], server_round: int) -> dict[int, dict[str, np.ndarray]]:
        """Phase 1 (and clients without a cluster): the global body. Phase 2: the client's stored
        body, else its cluster's body; never another cluster's tensors."""
        out = super().downlinks(client_ids, server_round)
        if self.phase(server_round) == 1 or self.clusters is None:
            return out
        for cid in client_ids:
            cluster = self.clusters.get(cid)
            if cluster is None or cid in self._probing:
                continue
            model = {**self.clusters.models[cluster], **self.bodies.get(cid, {})}
            out[cid] = {k: model[k] for k in out[cid]}  # the same keys, from the client's body
        return out

    # ------------------------------------------------------------------ the round
    @override
    def prepare_round(self, server_round: int, task: str) -> None:
        """Before a training round: the switch to phase 2 when phase 1 is over, then the probes of
        the clients that connected since (their bytes count in the round's traffic)."""
        if task != "train":
            return
        if self.phase1_end is None and not self._continue_phase1(server_round):
            self._switch(server_round)
        if self.phase1_end is not None:
            self._probe_new_clients(server_round)

    def _probe_new_clients(self, server_round: int) -> None:
        """A connected client without a layer runs a vote-only pass; it joins the cluster of its
        vote, or the largest cluster if no cluster has that layer."""
        new = sorted(c for c in self.clients if c not in self.layer_of)
        if not new:
            return
        self._probing = set(new)
        updates = self.clients.exchange(new, server_round, super().downlinks(new, server_round))
        self._probing = set()
        for u in updates:
            vote = self._vote_of(u)
            if vote is not None:
                self.votes.setdefault(u.client_id, []).append((server_round, vote))
            self._assign(u.client_id, vote)
            self.probed.append(u.client_id)
        log(
            INFO,
            "FedCPMD round %d: probed %d new client(s): %s",
            server_round,
            len(updates),
            {u.client_id: self.layer_of.get(u.client_id) for u in updates},
        )

    def _assign(self, client_id: int, vote: str | None) -> None:
        if self.ablation == "only_decoupling" or self.clusters is None:
            if vote is not None:
                self.layer_of[client_id] = vote
            return
        if vote in self.cluster_layers:
            cluster = self.cluster_layers.index(vote)
        elif len(self.clusters):
            cluster = self.clusters.largest()
        else:  # no cluster at all yet: this client starts one
            self.cluster_layers.append(vote or self.candidates[-1])
            self.clusters = Clusters([[client_id]], [self._cluster_start([client_id], self.cluster_layers[-1])])
            self.layer_of[client_id] = self.cluster_layers[-1]
            return
        self.clusters.add(client_id, cluster)
        self.layer_of[client_id] = self.cluster_layers[cluster]

    def _vote_of(self, update: ClientUpdate) -> str | None:
        v = update.metrics.get("vote", -1.0)
        if v == int(v) and 0 <= int(v) < len(self.candidates):
            return self.candidates[int(v)]
        if v != -1.0:
            log(
                WARNING,
                "FedCPMD: client %d sent vote %s outside 0..%d; ignored",
                update.client_id,
                v,
                len(self.candidates) - 1,
            )
        return None

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        if self.phase(server_round) == 1:
            return self._aggregate_phase1(server_round, updates)
        if self.ablation == "only_decoupling" or self.clusters is None:
            return self._aggregate_decoupled(updates)
        return self._aggregate_clusters(updates)

    def _aggregate_phase1(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        body = self.model.keys([g for g in self.model.groups if g != self.classifier])
        trained = [u for u in updates if u.arrays]
        if trained:
            self.model.global_arrays.update(
                fedavg([{k: u.arrays[k] for k in body} for u in trained], [u.num_examples for u in trained])
            )
        for u in trained:
            self.last_cls[u.client_id] = {k: u.arrays[k] for k in self.model.keys([self.classifier])}
            self.n_train[u.client_id] = u.num_examples
        record: dict[str, Any] = {"phase": 1}
        for u in updates:
            vote = self._vote_of(u)
            if vote is not None:
                self.votes.setdefault(u.client_id, []).append((server_round, vote))
                record[f"client_votes_{vote}"] = record.get(f"client_votes_{vote}", 0) + 1
        record["voted_clients"] = len(self.votes)
        record["log_keys"] = ["phase", "voted_clients"]
        return record

    def _aggregate_clusters(self, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """Eq. 12-13 and Eq. 5 inside each cluster; nothing crosses a cluster's border."""
        clusters = self.clusters
        assert clusters is not None
        accs: list[float | None] = []
        phi_bytes = 0
        for c, ups in sorted(clusters.group(updates).items()):
            layer = self.cluster_layers[c]
            body_keys = self.model.keys(self.cluster_groups(layer))
            clusters.models[c] = cluster_fedavg(ups, body_keys)  # Eq. 5: omega_m
            if self.ablation == "only_cluster":
                continue
            phi_keys = self.model.keys([layer])
            phi_bytes += sum(u.arrays[k].nbytes for u in ups for k in phi_keys)
            phi = cosine_from_gram(gram_matrix([u.arrays for u in ups], phi_keys), EQ8_EPS, lo=0.0)  # Eq. 13
            mixed_groups = self.cluster_groups(layer)
            if self.fedcmd_split:  # the layers before l* are the cluster's FedAvg, only those after are mixed
                mixed_groups = self.model.groups[self.model.groups.index(layer) + 1 :]
            mixed_keys = self.model.keys(mixed_groups)
            if mixed_keys:
                posts = personalized_posts([{k: u.arrays[k] for k in mixed_keys} for u in ups], phi)  # Eq. 12
                for u, post in zip(ups, posts):
                    self.bodies[u.client_id] = post
        for c in range(len(clusters)):
            ms = [u.metrics for u in updates if clusters.get(u.client_id) == c]
            accs.append(weighted_test_metrics(ms).get("test_before_acc") if ms else None)
        record: dict[str, Any] = {
            "phase": 2,
            "num_clusters": len(clusters),
            "cluster_layers": list(self.cluster_layers),
            "cluster_sizes": clusters.sizes(),
            "cluster_acc": accs,
            "log_keys": ["phase", "num_clusters"],
        }
        if phi_bytes:
            record["bytes_up_phi"] = phi_bytes  # the personal layers' share of bytes_up (similarity only)
        return record

    def _aggregate_decoupled(self, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """only_decoupling: every tensor FedAvg'd over the participants for which it is not personal."""
        trained = [u for u in updates if u.arrays]
        if trained:
            self.model.global_arrays.update(fedavg([u.arrays for u in trained], [u.num_examples for u in trained]))
        return {"phase": 2, "log_keys": ["phase"]}

    # ------------------------------------------------------------------ reporting

    def run_summary(self) -> dict[str, Any]:
        """The three reporting views' extras (FedCPMD paper, evaluation protocol): clusters, layers and the
        mean-cluster accuracy (the unweighted mean over clusters of each cluster's last-10-round mean)."""
        out: dict[str, Any] = {
            "phase1_rounds": self.phase1_end,
            "personal_layers": dict(sorted(Counter(self.layer_of.values()).items())),
            "probed": sorted(self.probed),
        }
        if self.clusters is not None:
            out.update({"clusters": self.clusters.members, "cluster_layers": list(self.cluster_layers)})
            per_cluster = []
            for c in range(len(self.clusters)):
                curve = [
                    r["cluster_acc"][c]
                    for r in self.run.history
                    if len(r.get("cluster_acc", [])) > c and r["cluster_acc"][c] is not None
                ]
                if curve:
                    per_cluster.append(float(np.mean(curve[-10:])))
            if per_cluster:
                out["mean_cluster_acc"] = float(np.mean(per_cluster))
        return out
