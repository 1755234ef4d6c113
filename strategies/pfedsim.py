"""pFedSim (Tan et al., 2023): FedAvg warm-up, then similarity-weighted personal bodies.

Rounds 1..W (W = int(rho_general * total_rounds), FL-bench's rule): FedAvg of the whole model.
Rounds W+1..K: the classifier stays on each client (a client gets the warm-up classifier once,
at its first personal round); the server keeps every client's last trained body and a
persistent N x N similarity matrix S (identity at first). After a round, S_ij for every pair
of that round's participants = max(0, mean over classes of the cosine of their classifier
weight rows). A client receives the average of all stored bodies weighted by its row of S:
``weighting="pfedsim"`` (the authors' code) uses w_ij ~ -log(1 - S_ij) with S_ii = 0.9999,
``"linear"`` uses w_ij ~ S_ij with S_ii = 1. Clients upload the classifier too (for S
only: it is never averaged or sent back).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
from .shared.aggregation import mixing_average, normalized_weights
from .shared.similarity import EQ8_EPS, cosine_of_vectors

WEIGHTINGS = ("pfedsim", "linear")
SELF_SIM = 0.9999  # S_ii in the authors' code; also caps S_ij so that -log(1 - S) stays finite


def row_normalized(arrays: Mapping[str, np.ndarray], keys: Sequence[str]) -> np.ndarray:
    """The rows (output units) of every matrix in ``keys`` scaled to unit norm, concatenated.

    The cosine of two such vectors is the mean over rows of the row-wise cosines (each row
    has norm 1), i.e. pFedSim's ``cosine_similarity(W_i, W_j, dim=-1).mean()``. Biases and
    other 1-D tensors are left out, as in the authors' code (classifier.weight only).
    """
    rows = [
        np.asarray(arrays[k], dtype=np.float64).reshape(len(arrays[k]), -1) for k in keys if np.ndim(arrays[k]) >= 2
    ]
    if not rows:
        raise ValueError(f"pFedSim needs a weight matrix among {list(keys)}")
    stacked = np.concatenate(rows)
    norms = np.linalg.norm(stacked, axis=1, keepdims=True)
    return (stacked / np.where(norms > 0, norms, 1.0)).reshape(-1)


def classifier_similarity(classifiers: Sequence[Mapping[str, np.ndarray]], keys: Sequence[str]) -> np.ndarray:
    """S_ij = max(0, mean row-wise cosine of the clients' classifier weights), in [0, 1]."""
    return cosine_of_vectors([row_normalized(c, keys) for c in classifiers], EQ8_EPS, lo=0.0)


def pfedsim_weights(sim_row: np.ndarray, own: int, weighting: str = "pfedsim") -> np.ndarray:
    """Client ``own``'s weights over all clients' bodies from its row of S (sum 1)."""
    s = np.clip(np.asarray(sim_row, dtype=np.float64), 0.0, 1.0)
    if weighting == "linear":
        s[own] = 1.0
        return normalized_weights(s)
    if weighting == "pfedsim":
        s = np.minimum(s, SELF_SIM)
        s[own] = SELF_SIM
        return normalized_weights(-np.log1p(-s))
    raise ValueError(f"pFedSim weighting must be one of {list(WEIGHTINGS)}, got {weighting!r}")


@dataclass(frozen=True)
class PFedSimOptions(MethodOptions):
    """PFedSim's options (``method.<name>=`` on the command line, keywords of ``PFedSim(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    rho_general: float = option(0.5, "warm-up share of the rounds (the papers: 0.5)", low=0, high=1)
    total_rounds: int | None = option(None, "K, the run's rounds (the method config sets it to rounds)", low=1)
    warmup: int | None = option(None, "the warm-up in rounds (overrides rho_general)", low=0)
    weighting: str = option(
        "pfedsim", "how similarities weigh the bodies: pfedsim (-log(1 - S)) or linear", choices=WEIGHTINGS
    )


class PFedSim(PersonalizedStrategy):
    """A FedAvg warm-up, then a personal classifier and bodies mixed by classifier similarity
    (options: :class:`PFedSimOptions`)."""

    name = "pfedsim"
    options_type = PFedSimOptions
    traits = MethodTraits(
        # the last layer group is the method's classifier
        linear_head=True,
        state=("sim", "bodies", "head_seen"),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.warmup = phase_rounds("pFedSim warmup", o.warmup, o.rho_general, o.total_rounds, "floor", "rho_general")
        self.weighting = o.weighting
        self.head = [self.model.groups[-1]]
        self.body = self.model.groups[:-1]
        self.sim = np.eye(self.run.num_clients)
        self.bodies: dict[int, dict[str, np.ndarray]] = {}  # last trained body of each client
        self.head_seen: set[int] = set()  # clients holding their own classifier

    def personalizing(self, server_round: int) -> bool:
        """After the warm-up rounds: the classifier is personal and bodies are mixed by similarity."""
        return server_round > self.warmup

    @override
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return list(self.head) if self.personalizing(server_round) else []

    @override
    def uplink(self, client_id: int, server_round: int) -> Uplink:
        return Uplink(self.model.groups)  # after warm-up the classifier goes up for S only

    def body_weights(self, client_id: int) -> dict[int, float]:
        """Nonzero weights of client ``client_id`` over the clients' stored bodies."""
        w = pfedsim_weights(self.sim[client_id], client_id, self.weighting)
        return {int(j): float(w[j]) for j in np.flatnonzero(w)}

    def personal_bodies(self, client_ids: Sequence[int]) -> dict[int, dict[str, np.ndarray]]:
        """Each client's body: the stored bodies weighted by its row of S, all clients in one
        matrix product per block (O(len(client_ids) x N x body) in BLAS)."""
        warm = {k: self.model.global_arrays[k] for k in self.model.keys(self.body)}  # the warm-up body
        rows = np.stack([pfedsim_weights(self.sim[c], c, self.weighting) for c in client_ids])
        used = np.flatnonzero(rows.any(axis=0))
        bodies = [self.bodies.get(int(j), warm) for j in used]
        return dict(zip(client_ids, mixing_average(bodies, rows[:, used], keys=list(warm))))

    @override
    def downlinks(self, client_ids: Sequence[int], server_round: int) -> dict[int, dict[str, np.ndarray]]:
        if not self.personalizing(server_round):  # the warm-up: the base's global values
            return super().downlinks(client_ids, server_round)
        bodies = self.personal_bodies(client_ids)
        head = {k: self.model.global_arrays[k] for k in self.model.keys(self.head)}
        for c in client_ids:
            if c not in self.head_seen:  # the warm-up classifier, once
                bodies[c].update(head)
        return bodies

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        if not self.personalizing(server_round):
            return {"phase": "warmup", "log_keys": ["phase"], **super().aggregate(server_round, updates)}
        body_keys, head_keys = self.model.keys(self.body), self.model.keys(self.head)
        for u in updates:
            self.bodies[u.client_id] = {k: u.arrays[k] for k in body_keys}
            self.head_seen.add(u.client_id)
        record: dict[str, Any] = {"phase": "personal", "log_keys": ["phase"]}
        if len(updates) > 1:
            s = classifier_similarity([u.arrays for u in updates], head_keys)
            ids = [u.client_id for u in updates]
            off = ~np.eye(len(ids), dtype=bool)
            self.sim[np.ix_(ids, ids)] = np.where(off, s, self.sim[np.ix_(ids, ids)])
            record["sim_offdiag_mean"] = float(s[off].mean())
        if server_round == self.warmup + 1:
            log(INFO, "pFedSim: warm-up over after round %d; classifiers are personal now", self.warmup)
        return record

    @override
    def run_summary(self) -> dict[str, Any]:
        return {"warmup_rounds": self.warmup}
