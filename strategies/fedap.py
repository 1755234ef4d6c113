"""FedAP (Lu et al., "Personalized federated learning with adaptive batchnorm for healthcare", 2022).

As FedCMD/FedCPMD run it (FedCMD paper, hyper-parameters, FedCPMD paper, hyper-parameters: "model momentum mu = 0.5";
both papers
describe it as FedBN plus client similarities from a Wasserstein distance of BN statistics
weighting the aggregation; their code base is FL-bench):
- BN parameters and statistics never leave a client (FedBN; a model without BN is refused).
- Warm-up, rounds 1..W: FedAvg of the rest, ``warmup_epochs`` local epochs (FL-bench: 1).
- After the warm-up the server stops averaging. At its first round after the warm-up a client
  receives the warm-up model, measures the per-channel mean and variance of every BN layer's
  input on its training split with it (:mod:`client_app.roles.fedap`) and uploads them.
  d_ij = sum over BN layers l of sqrt(||m_i^l - m_j^l||^2 + ||sqrt(v_i^l) - sqrt(v_j^l)||^2)
  (the W2 distance of diagonal Gaussians), and client i's weights are
  w_ii = momentum, w_ij = (1 - momentum) * (1/d_ij) / sum_k (1/d_ik) for the others (model momentum).
- Client i then receives sum_j w_ij theta_j over the latest trained models theta_j (non-BN
  parameters) of the clients with statistics, its own included.
Resolutions (stated, since the papers give only mu):
- FL-bench's default FedAP pre-trains by passing one model through every client in turn each
  warm-up round (one client per message, on 30% of its data), which a round of this base (one
  message per sampled client) cannot express; its "f-FedAP" warm-up, FedAvg on all the data,
  is used instead. W = int(warmup_ratio * total_rounds) (FL-bench: 0.5) unless ``warmup`` is set.
- FL-bench measures every client's statistics at once after the warm-up; here a client
  measures them at its first sampled round after it (always with the warm-up model: until
  then its weights are its own row of the identity and its stored model is the warm-up model),
  and a client's weights range over the clients whose statistics are known so far.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from logging import INFO
from typing import Any

import numpy as np
from flwr.common import log
from typing_extensions import override

from pflower.protocol.options import MethodOptions, option

from .base.hooks import MethodTraits, Uplink
from .base.phases import phase_rounds
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate
from .shared.aggregation import mixing_average

Stats = Mapping[str, np.ndarray]  # "bn_mean/<i>", "bn_var/<i>" for each BN layer i


def bn_distance(a: Stats, b: Stats) -> float:
    """sum_l sqrt(||m_a - m_b||^2 + ||sqrt(v_a) - sqrt(v_b)||^2) over the BN layers l of a and b."""
    total = 0.0
    for key in sorted(k for k in a if k.startswith("bn_mean/")):
        var = "bn_var/" + key.split("/", 1)[1]
        dm = np.sum((np.asarray(a[key], np.float64) - np.asarray(b[key], np.float64)) ** 2)
        ds = np.sum((np.sqrt(np.asarray(a[var], np.float64)) - np.sqrt(np.asarray(b[var], np.float64))) ** 2)
        total += float(np.sqrt(dm + ds))
    return total


def stack_stats(stats: Sequence[Stats]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per BN layer (in :func:`bn_distance`'s order): every client's means and sqrt(variances), stacked (float64)."""
    layers = sorted(k for k in stats[0] if k.startswith("bn_mean/"))
    return [
        (
            np.stack([np.asarray(s[key], np.float64) for s in stats]),
            np.sqrt(np.stack([np.asarray(s["bn_var/" + key.split("/", 1)[1]], np.float64) for s in stats])),
        )
        for key in layers
    ]


def bn_distances(stacked: Sequence[tuple[np.ndarray, np.ndarray]], i: int) -> np.ndarray:
    """:func:`bn_distance` of client ``i`` to every client of :func:`stack_stats`, at once."""
    total = 0.0
    for means, stds in stacked:
        dm = np.sum((means[i] - means) ** 2, axis=1)
        ds = np.sum((stds[i] - stds) ** 2, axis=1)
        total = total + np.sqrt(dm + ds)
    return np.asarray(total, dtype=np.float64)


def fedap_weights(distances: Sequence[float], momentum: float) -> np.ndarray:
    """[w_ii, w_ij for the others]: momentum, then (1 - momentum) shared in proportion to 1/d_ij.

    Others at distance 0 share the (1 - momentum) equally (the limit of 1/d); with no others
    the client keeps its own model (weight 1).
    """
    d = np.asarray(distances, dtype=np.float64)
    if d.size == 0:
        return np.ones(1)
    inv = (d == 0).astype(np.float64) if np.any(d == 0) else 1.0 / d
    return np.concatenate([[momentum], (1.0 - momentum) * inv / inv.sum()])


@dataclass(frozen=True)
class FedAPOptions(MethodOptions):
    """FedAP's options (``method.<name>=`` on the command line, keywords of ``FedAP(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    momentum: float = option(0.5, "the weight of a client's own model (the papers: 0.5)", low=0, high=1)
    warmup_ratio: float = option(0.5, "W = int(warmup_ratio * total_rounds)", low=0, high=1)
    total_rounds: int | None = option(None, "K, the run's rounds (the method config sets it to rounds)", low=1)
    warmup: int | None = option(None, "W in rounds (overrides warmup_ratio)", low=0)
    warmup_epochs: int | None = option(1, "local epochs in the warm-up (null: local_epochs)", low=0)


class FedAP(PersonalizedStrategy):
    """FedBN with a FedAvg warm-up, then models mixed by the distance of the clients' BN
    statistics (options: :class:`FedAPOptions`)."""

    name = "fedap"
    options_type = FedAPOptions
    traits = MethodTraits(
        role="fedap",
        state=("models", "stats"),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.bn_keys = list(self.model.schema().bn_params)
        self.bn_channels = list(self.model.schema().bn_channels)
        if not self.bn_channels:
            raise ValueError("FedAP weighs clients by BatchNorm statistics: this model has no BatchNorm layer")
        self.momentum = o.momentum
        self.warmup = phase_rounds("FedAP warmup", o.warmup, o.warmup_ratio, o.total_rounds, "floor", "warmup_ratio")
        self.warmup_epochs = o.warmup_epochs
        self.models: dict[int, dict[str, np.ndarray]] = {}  # latest trained non-BN parameters of each client
        self.stats: dict[int, dict[str, np.ndarray]] = {}  # BN input statistics of each client

    def personalizing(self, server_round: int) -> bool:
        """After the warm-up rounds: then each client's BN layers are personal, mixed by FedAP's similarity."""
        return server_round > self.warmup

    @override
    def personal_keys(self, client_id: int, server_round: int) -> list[str]:
        return list(self.bn_keys)

    def needs_stats(self, client_id: int, server_round: int) -> bool:
        """Whether the client must send its BN input statistics this round (once, when personalization starts)."""
        return self.personalizing(server_round) and client_id not in self.stats

    @override
    def role_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        epochs = None if self.personalizing(server_round) else self.warmup_epochs
        return {"bn_stats": self.needs_stats(client_id, server_round), "epochs": epochs}

    @override
    def uplink(self, client_id: int, server_round: int) -> Uplink:
        up = super().uplink(client_id, server_round)
        if not self.needs_stats(client_id, server_round):
            return up
        f32 = np.dtype(np.float32)
        stats = {f"bn_{s}/{i}": ((c,), f32) for i, c in enumerate(self.bn_channels) for s in ("mean", "var")}
        return replace(up, extra=stats)

    def weight_rows(self, client_ids: Sequence[int]) -> tuple[list[int], np.ndarray]:
        """(columns, W): W[r, c] is client ``client_ids[r]``'s weight on client ``columns[c]``'s
        stored model (rows sum to 1). The BN distances of each client to all others are one
        vectorized pass over the stacked statistics (O(N x channels) per client)."""
        holders = sorted(self.stats)
        columns = holders + sorted({c for c in client_ids if c not in self.stats})
        col = {j: i for i, j in enumerate(columns)}
        w = np.zeros((len(client_ids), len(columns)))
        stacked = stack_stats([self.stats[j] for j in holders]) if holders else []
        holder_ids = np.asarray(holders)
        for r, c in enumerate(client_ids):
            if c not in self.stats:
                w[r, col[c]] = 1.0
                continue
            others = np.flatnonzero(holder_ids != c)
            row = fedap_weights(bn_distances(stacked, col[c])[others], self.momentum)
            w[r, col[c]], w[r, others] = row[0], row[1:]
        return columns, w

    def weights(self, client_id: int) -> dict[int, float]:
        """Client ``client_id``'s aggregation weights over the clients' stored models (sum 1)."""
        if client_id not in self.stats:
            return {client_id: 1.0}
        columns, w = self.weight_rows([client_id])
        others = sorted(j for j in self.stats if j != client_id)
        return {client_id: float(w[0, columns.index(client_id)]), **{j: float(w[0, columns.index(j)]) for j in others}}

    @override
    def downlinks(self, client_ids: Sequence[int], server_round: int) -> dict[int, dict[str, np.ndarray]]:
        if not self.personalizing(server_round):  # the warm-up: the base's global values
            return super().downlinks(client_ids, server_round)
        personal = set(self.bn_keys)  # its BN layers: personal keys, never sent
        keys = [k for k in self.model.keys(client_id=client_ids[0]) if k not in personal] if client_ids else []
        columns, w = self.weight_rows(client_ids)
        models = [self.models.get(j, self.model.global_arrays) for j in columns]  # the warm-up model until trained
        return dict(zip(client_ids, mixing_average(models, w, keys=keys)))

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        if not self.personalizing(server_round):
            return {"phase": "warmup", "log_keys": ["phase"], **super().aggregate(server_round, updates)}
        if server_round == self.warmup + 1:
            log(INFO, "FedAP: warm-up over after round %d; BN-similarity-weighted personal models now", self.warmup)
        for u in updates:
            self.models[u.client_id] = u.arrays
            if u.extra:
                self.stats[u.client_id] = u.extra
        return {"phase": "personal", "log_keys": ["phase"], "clients_with_stats": len(self.stats)}

    @override
    def run_summary(self) -> dict[str, Any]:
        return {"warmup_rounds": self.warmup}
