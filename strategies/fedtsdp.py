"""FedTSDP: two-stage clustering with adaptive personalization layers (Zhu, Fan, Xie 2023).

Clients are plain SGD trainers that keep their whole model across rounds (``client_keeps =
"model"``) and upload all of it (BN statistics too). Every round the server runs each uploaded
model on one batch of public unlabelled data it alone holds, and computes the Hopkins
statistic H of the softmax outputs. When H > ``h_th`` it re-clusters every participant from
scratch: stage 1 is DBSCAN on their pairwise Jensen-Shannon divergences (``eps1``), stage 2
DBSCAN on weight distances inside each stage-1 group (``eps2``), noise points become singletons;
in the same round the public batch's sampling weights are raised (so it keeps being drawn) and
the shared-unit counter is multiplied by ``psi``. Otherwise the clustering stays. Each cluster
averages (FedAvg) all units of its members; a client receives the first S = floor(counter)
units (state-dict tensors, input to output) of its cluster's model and keeps the rest: a unit
that turns personal keeps the client's own trained value. With ``h_th = inf`` it is FedAvg.

The math lives in :mod:`strategies.fedtsdp_math`; this file holds the round. Resolutions of
the points the FedTSDP paper leaves open are read as follows: one public batch per round
shared by all clients, softmax + natural-log JS not square-rooted, m_tilde = max(2,
round(0.1 m)), the literal amended sampling with a bounded option, one global
float counter, trainable parameters for the weight distance, noise as singletons,
re-clustering from scratch; a client absent from a re-clustering joins the new cluster
holding most of its former cluster-mates, or the largest one.

Where the server runs the models: on the server, from the uploads (the clients upload their
whole model anyway, for eq. 9), in eval mode with the uploaded BN statistics, so the outputs are
what each client's model computes; no extra message to the devices.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from logging import INFO
from typing import Any

import numpy as np
import torch
from flwr.common import log
from typing_extensions import override

from pflower.protocol.options import MethodOptions, option

from .base.diagnostics import Panel
from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate
from .fedtsdp_math import (
    DECAY_MODES,
    RADIUS_MODES,
    amend_weights,
    decay_shared,
    default_m_tilde,
    draw_batch,
    hopkins,
    js_matrix,
    pair_spread,
    stage2_radius,
    two_stage,
    upper_pairs,
    weight_distances_from_gram,
)
from .shared.clusters import Clusters, cluster_fedavg
from .shared.model_distance import gram_matrix

AMEND_MODES = ("literal", "bounded")


@dataclass(frozen=True)
class FedTSDPOptions(MethodOptions):
    """FedTSDP's options (``method.<name>=`` on the command line, keywords of ``FedTSDP(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    h_th: float = option(0.65, "Hopkins threshold (strict >, the paper's); inf: never cluster, exactly FedAvg", low=0)
    eps1: float = option(
        0.15, "stage 1 DBSCAN radius on JS divergence (natural log, max ln 2); inf: one group", above=0
    )
    eps2: float = option(
        3.5, "stage 2 DBSCAN radius on weight L2 distance (calibrate for small models); inf: one group", above=0
    )
    eps2_mode: str = option(
        "absolute",
        "absolute: eps2 is a weight distance (the paper's); median: a fraction of the participants' median pair "
        "distance",
        choices=RADIUS_MODES,
    )
    min_pts: int = option(2, "DBSCAN min_samples in both stages (the point itself included)", low=1)
    psi: float = option(0.98, "shared-unit counter *= psi at each re-clustering", above=0, high=1)
    decay: str = option(
        "float", "float: the counter kept as a float, S = floor; int: int(counter * psi)", choices=DECAY_MODES
    )
    public_batch: int = option(50, "public points drawn per round (one batch shared by all clients)", low=1)
    amend: str = option(
        "literal",
        "literal: + N_pub / batch to the triggering batch's weights (eqs. 7-8); bounded: + amend_increment",
        choices=AMEND_MODES,
    )
    amend_increment: float | None = option(None, "bounded mode's increment (null: 1 / N_pub)", above=0)
    m_tilde: int | None = option(None, "Hopkins sample size (null: max(2, round(0.1 m)))", low=1)
    hopkins_repeats: int = option(1, "H = the mean of this many Hopkins draws (1: the paper's one draw)", low=1)
    upsilon: float = option(1e-6, "the eq. 9 offset (torch pairwise_distance's eps)", low=0)


class FedTSDP(PersonalizedStrategy):
    """Two-stage clustering triggered by the Hopkins statistic, with a shared prefix that shrinks
    at each re-clustering (options: :class:`FedTSDPOptions`). With ``amend=bounded`` a triggering
    batch gains mass slowly; ``hopkins_repeats`` > 1 lowers the noise of H (one draw with
    m_tilde = 2 spreads about ±0.07 round to round)."""

    name = "fedtsdp"
    options_type = FedTSDPOptions
    traits = MethodTraits(
        diagnostic_panels=(
            Panel("hopkins", "Hopkins statistic H", threshold="h_th", events="triggered"),
            Panel("shared_units", "shared prefix (units)"),
            Panel("num_clusters", "clusters", events="partition_changed"),
            Panel("js_median", "median JS of the pairs (re-clusterings)", threshold="eps1"),
            Panel(
                "weight_dist_median",
                "median weight distance in stage-1 groups",
                threshold="eps2",
                threshold_key="eps2_radius",
            ),
        ),
        # a unit that turns personal keeps the client's own trained value
        client_keeps="model",
        # BN statistics are units of the shared prefix and part of the upload
        shared_buffers=True,
        # the runner hands the public images to attach_public()
        needs_public_data=True,
        state=(
            "units",
            "trainable_units",
            "shared_counter",
            "clusters",
            "trained",
            "tsdp_rng",
            "public_weights",
            "events",
        ),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.h_th, self.eps1, self.eps2, self.min_pts, self.psi, self.decay = (
            o.h_th,
            o.eps1,
            o.eps2,
            o.min_pts,
            o.psi,
            o.decay,
        )
        self.eps2_mode = o.eps2_mode
        self.public_batch, self.amend, self.upsilon = o.public_batch, o.amend, o.upsilon
        self.amend_increment, self.m_tilde, self.hopkins_repeats = o.amend_increment, o.m_tilde, o.hopkins_repeats
        self.units = self.model.schema().keys(buffers=True)  # state-dict order: input to output
        self.trainable_units = self.model.schema().keys()
        self.shared_counter = float(len(self.units))  # Ls: every unit shared at the start
        self.clusters = Clusters.single(range(self.run.num_clients), self.model.global_arrays)
        self.trained: list[int] = []  # clients that have trained at least once (sorted)
        self.tsdp_rng = np.random.default_rng([int(self.run.seed), 7_368_787])  # public batches, Hopkins draws
        self.public_weights: np.ndarray | None = None  # Wt over the public points
        self.events: list[dict[str, Any]] = []  # the trajectory's re-clusterings, for summary.json
        self.public_images: torch.Tensor | None = None
        model = args[0] if args else kwargs.get("model")
        if isinstance(model, Mapping):  # one architecture given by name (FedTSDP is homogeneous)
            model = next(iter(model.values()))
        self._probe = copy.deepcopy(model)  # the server runs each upload in it on the public batch

    # ------------------------------------------------------------------ public data
    @override
    def attach_public(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> None:
        """The server's public unlabelled images (normalized like the clients' data)."""
        if len(images) < 1:
            raise ValueError("FedTSDP needs public data on the server: the public split is empty")
        self.public_images = images
        if self.public_weights is None or len(self.public_weights) != len(images):
            if self.public_weights is not None:
                raise ValueError(
                    f"the checkpoint's public sampling weights cover {len(self.public_weights)} points, the public "
                    "split "
                    f"now has {len(images)}: resume with the run's dataset settings"
                )
            self.public_weights = np.full(len(images), 1.0 / len(images))

    @property
    def shared_units(self) -> int:
        """S: the leading units clients receive this round."""
        return max(0, min(int(math.floor(self.shared_counter)), len(self.units)))

    # ------------------------------------------------------------------ downlink
    @override
    def downlinks(self, client_ids: Sequence[int], server_round: int) -> dict[int, dict[str, np.ndarray]]:
        prefix = self.units[: self.shared_units]
        out = {}
        for cid in client_ids:
            model = self.clusters.model_of(cid)
            keys = self.units if cid not in self.trained else prefix  # first contact: the whole cluster model
            out[cid] = {k: model[k] for k in keys}
        return out

    # ------------------------------------------------------------------ the round
    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        ups = [u for u in updates if u.arrays]
        self.trained = sorted(set(self.trained) | {u.client_id for u in ups})
        record: dict[str, Any] = {}
        if ups:
            self.model.global_arrays = cluster_fedavg(
                ups
            )  # the all-client FedAvg: Flower's result, the reference model
        triggered = False
        if len(ups) >= 3 and self.public_images is not None:
            batch = draw_batch(self.public_weights, self.public_batch, self.tsdp_rng)
            probs = self._public_outputs(ups, batch)
            m_tilde = self.m_tilde or default_m_tilde(len(ups))
            points = probs.reshape(len(ups), -1)
            h = float(np.mean([hopkins(points, m_tilde, self.tsdp_rng) for _ in range(self.hopkins_repeats)]))
            triggered = h > self.h_th
            record["hopkins"] = h
            if triggered:
                record.update(self._recluster(server_round, ups, probs, batch, h))
            record["public_batch_mass"] = float(self.public_weights[batch].sum())
        by_cluster = self.clusters.group(ups)
        for c, members in by_cluster.items():
            self.clusters.models[c] = cluster_fedavg(members)
        record.update(
            {
                "triggered": int(triggered),
                "num_clusters": len(self.clusters),
                "cluster_sizes": self.clusters.sizes(),
                "clusters": self.clusters.members,
                "shared_units": self.shared_units,
                "shared_counter": self.shared_counter,
                "log_keys": ["num_clusters", "shared_units"] + (["hopkins"] if "hopkins" in record else []),
            }
        )
        return record

    def _recluster(
        self, server_round: int, ups: Sequence[ClientUpdate], probs: np.ndarray, batch: np.ndarray, h: float
    ) -> dict[str, Any]:
        """Steps 10.1-10.5 and 12: two-stage clustering of the participants, amended sampling, decay."""
        ids = [u.client_id for u in ups]
        keys = self.trainable_units
        count = sum(int(np.prod(self.model.template[k][0])) for k in keys)
        sums = np.array([sum(float(np.sum(u.arrays[k], dtype=np.float64)) for k in keys) for u in ups])

        within: list[np.ndarray] = []  # the stage-2 distances, logged so that eps2 can be calibrated

        computed: dict[tuple[int, ...], np.ndarray] = {}  # the relative radius's all-participant matrix is
        # often stage 1's one group too: one Gram for both (the same rows in the same order, so the same bits)

        def pair_distances(rows: Sequence[int]) -> np.ndarray:  # from the rows' Gram matrix: no model stacked
            rows = tuple(rows)
            if rows not in computed:
                gram = gram_matrix([ups[i].arrays for i in rows], keys)
                computed[rows] = weight_distances_from_gram(gram, sums[list(rows)], count, self.upsilon)
            return computed[rows]

        def distances(rows: Sequence[int]) -> np.ndarray:  # only inside a stage-1 group
            d = pair_distances(rows)
            within.extend(upper_pairs(d))
            return d

        relative = self.eps2_mode != "absolute" and not math.isinf(self.eps2)
        radius = stage2_radius(pair_distances(range(len(ups))), self.eps2, self.eps2_mode) if relative else self.eps2
        js = js_matrix(probs)
        first, second = two_stage(js, distances, self.eps1, radius, self.min_pts)
        members = [[ids[i] for i in g] for g in second]
        models = [cluster_fedavg([ups[i] for i in g]) for g in second]
        new = Clusters(members, models)
        for cid in sorted(set().union(*self.clusters.members) - set(ids)):
            new.add(cid, self._home(cid, new))
        # a trigger re-clusters from scratch but may find the clusters it had: count the ones that moved a client
        changed = {frozenset(m) for m in new.members} != {frozenset(m) for m in self.clusters.members}
        self.clusters = new
        increment = (
            len(self.public_weights) / len(batch)
            if self.amend == "literal"
            else (self.amend_increment if self.amend_increment is not None else 1.0 / len(self.public_weights))
        )
        self.public_weights = amend_weights(self.public_weights, batch, increment)
        self.shared_counter = decay_shared(self.shared_counter, self.psi, self.decay)
        event = {
            "round": server_round,
            "hopkins": h,
            "stage1_clusters": len(first),
            "num_clusters": len(second),
            "partition_changed": int(changed),
            "shared_units": self.shared_units,
        }
        self.events.append(event)
        log(
            INFO,
            "FedTSDP round %d: H %.3f > %.2f: %d stage-1 groups, %d clusters %s; shared units now %d of %d",
            server_round,
            h,
            self.h_th,
            len(first),
            len(second),
            self.clusters.members,
            self.shared_units,
            len(self.units),
        )
        # the pairs each radius was compared with: JS over all participants (eps1), weight
        # distances inside the stage-1 groups (eps2); `pflower report` and the docs read them
        spread = {f"js_{k}": v for k, v in pair_spread(upper_pairs(js)).items()}
        spread.update({f"weight_dist_{k}": v for k, v in pair_spread(within).items()})
        if relative:
            spread["eps2_radius"] = radius  # the radius stage 2 compared with (eps2_mode=median)
        return {"stage1_clusters": len(first), "partition_changed": int(changed), **spread}

    def _home(self, client_id: int, new: Clusters) -> int:
        """The new cluster holding most of ``client_id``'s former cluster-mates (ties and
        clients never clustered: the largest cluster)."""
        old = self.clusters.get(client_id)
        if old is None:
            return new.largest()
        mates = set(self.clusters.members[old]) - {client_id}
        counts = [len(mates & set(m)) for m in new.members]
        if max(counts, default=0) == 0:
            return new.largest()
        return max(range(len(new)), key=lambda c: (counts[c], len(new.members[c]), -c))

    @torch.no_grad()
    def _public_outputs(self, ups: Sequence[ClientUpdate], batch: np.ndarray) -> np.ndarray:
        """[m, B, C] softmax outputs of every uploaded model on the public batch (eval mode)."""
        model = self._probe
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model.to(device).eval()
        x = self.public_images[torch.as_tensor(batch)].to(device)
        out = []
        for u in ups:
            model.load_state_dict({k: torch.tensor(v) for k, v in u.arrays.items()}, strict=False)
            out.append(torch.softmax(model(x).double(), dim=-1).cpu().numpy())
        return np.stack(out)

    @override
    def run_summary(self) -> dict[str, Any]:
        return {
            "clusters": self.clusters.members,
            "shared_units": self.shared_units,
            "units": len(self.units),
            "reclusterings": self.events,
            "partition_changes": sum(
                int(e.get("partition_changed", 0)) for e in self.events
            ),  # triggers that moved a client
        }
