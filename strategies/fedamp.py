"""FedAMP (Huang et al., AAAI 2021): attentive message passing between personalized models.

Each client keeps its own model w_i (every group is personal; it is uploaded after training,
so the server holds the latest w_j of every client that has trained; one that has not is the
initial model). Before client i trains, the server builds its personalized cloud model
u_i = sum_j xi_ij w_j over its own w_i and every stored w_j, and sends it as an extra array
(``u/<key>``). The client trains w_i on F_i(w) + lam/2 ||w - u_i||^2 (the proximal term of
FedProx/Ditto, pulled toward u_i) and w_i is the model evaluated.

Attention weights (a row of xi sums to 1, all >= 0): xi_ii = ``self_weight`` (alpha_k), and
xi_ij = (1 - self_weight) * softmax_j(s_ij) over the others, with
- ``kernel="distance"``: s_ij = -||w_i - w_j||^2 / sigma, the paper's exp(-||w_i - w_j||^2 / sigma)
  attention, normalized over j;
- ``kernel="cosine"``: s_ij = sigma * cos(w_i, w_j), HeurFedAMP (the paper's heuristic variant;
  the KAPC paper describes FedAMP as "weighted by cosine similarity").
Resolution: the paper's exact form xi_ij = alpha_k * A'(||w_i - w_j||^2), xi_ii = 1 - sum_j xi_ij
can make xi_ii negative when alpha_k is large; the normalized form above (HeurFedAMP's) keeps
xi a convex combination with the self-weight as its one knob, for both kernels. The softmax is
computed stably, so large distances never underflow to an all-zero row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from typing_extensions import override

from pflower.client_app.roles.fedamp import CLOUD_PREFIX, FedAMPArgs
from pflower.protocol.options import option

from .base.hooks import MethodTraits, Uplink
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate
from .shared.aggregation import column_blocks, mixing_average
from .shared.model_distance import inner_products, spread, squared_norms

KERNELS = ("distance", "cosine")


def attention_scores(
    dots: np.ndarray, own_sq: float, others_sq: np.ndarray, kernel: str = "distance", sigma: float = 1.0
) -> np.ndarray:
    """s_ij for the others j from <w_i, w_j>, ||w_i||^2 and ||w_j||^2 (see the module docstring)."""
    dots, others_sq = np.asarray(dots, dtype=np.float64), np.asarray(others_sq, dtype=np.float64)
    if kernel == "distance":
        return -np.maximum(own_sq + others_sq - 2.0 * dots, 0.0) / sigma
    if kernel == "cosine":
        return sigma * dots / (np.sqrt(max(own_sq, 0.0) * np.maximum(others_sq, 0.0)) + 1e-12)
    raise ValueError(f"FedAMP kernel must be one of {list(KERNELS)}, got {kernel!r}")


def attention_weights(scores: np.ndarray, self_weight: float) -> np.ndarray:
    """[xi_ii, xi_ij for the others]: self_weight, then (1 - self_weight) * softmax(scores); sums to 1.

    With no others the client's own model gets weight 1.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        return np.ones(1)
    e = np.exp(scores - scores.max())
    return np.concatenate([[self_weight], (1.0 - self_weight) * e / e.sum()])


def attention_matrix(gram: np.ndarray, self_weight: float, sigma: float = 1.0, kernel: str = "distance") -> np.ndarray:
    """The full m x m xi of m models from their Gram matrix (diagnostics and tests)."""
    gram = np.asarray(gram, dtype=np.float64)
    m = len(gram)
    xi = np.zeros((m, m))
    sq = np.diag(gram)
    for i in range(m):
        others = [j for j in range(m) if j != i]
        row = attention_weights(attention_scores(gram[i, others], sq[i], sq[others], kernel, sigma), self_weight)
        xi[i, i], xi[i, others] = row[0], row[1:]
    return xi


@dataclass(frozen=True)
class FedAMPOptions(FedAMPArgs):
    """FedAMP's options (``method.<name>=`` on the command line, keywords of ``FedAMP(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    sigma: float = option(1.0, "kernel scale", above=0)
    self_weight: float = option(0.5, "alpha_k = xi_ii, a client's weight on its own model", low=0, high=1)
    kernel: str = option("distance", "attention kernel over model distances or cosines", choices=KERNELS)


class FedAMP(PersonalizedStrategy):
    """Attentive message passing: each client is pulled toward its own cloud model u_i, a
    similarity-weighted mix of the clients' latest models (options: :class:`FedAMPOptions`)."""

    name = "fedamp"
    options_type = FedAMPOptions
    traits = MethodTraits(
        role="fedamp",
        state=("models",),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.lam, self.sigma, self.self_weight, self.kernel = o.lam, o.sigma, o.self_weight, o.kernel
        self.models: dict[int, dict[str, np.ndarray]] = {}  # latest uploaded w_j of each client

    @override
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return list(self.model.groups)

    @override
    def uplink(self, client_id: int, server_round: int) -> Uplink:
        return Uplink(self.model.groups)

    def cloud_weights(self, client_id: int) -> tuple[list[dict[str, np.ndarray]], np.ndarray]:
        """(models, xi row): client ``client_id``'s own model first, then every other stored one."""
        keys = list(self.model.global_arrays)
        own = self.models.get(client_id, self.model.global_arrays)  # never trained: the initial model
        others = [w for j, w in sorted(self.models.items()) if j != client_id]
        if not others:
            return [own], np.ones(1)
        dots = inner_products([own], others, keys)[0]
        scores = attention_scores(
            dots, squared_norms([own], keys)[0], squared_norms(others, keys), self.kernel, self.sigma
        )
        return [own, *others], attention_weights(scores, self.self_weight)

    def cloud_models(self, client_ids: Sequence[int]) -> dict[int, dict[str, np.ndarray]]:
        """u_i = sum_j xi_ij w_j for every client in ``client_ids`` at once.

        The inner products of each client's own model with every stored one (the only
        distances the attention needs) are one matrix product per block of parameters, and so
        is the mixing: O(len(client_ids) x N x params) in BLAS, the same numbers as
        :meth:`cloud_weights` row by row.
        """
        keys = list(self.model.global_arrays)
        stored = sorted(self.models)
        columns: list[Mapping[str, np.ndarray]] = [self.models[j] for j in stored]
        position = {j: c for c, j in enumerate(stored)}
        if any(c not in position for c in client_ids):  # never trained: the initial model
            columns.append(self.model.global_arrays)
        own = np.array([position.get(c, len(stored)) for c in client_ids], dtype=np.int64)
        dots, sq = np.zeros((len(client_ids), len(columns))), np.zeros(len(columns))
        for *_, block in column_blocks(columns, keys, extra_rows=len(client_ids)):
            dots += block[own] @ block.T
            sq += np.einsum("ij,ij->i", block, block)
        xi = np.zeros((len(client_ids), len(columns)))
        stored_cols = np.arange(len(stored))
        for r, (c, o) in enumerate(zip(client_ids, own)):
            others = stored_cols[stored_cols != o]
            if not len(others):
                xi[r, o] = 1.0
                continue
            row = attention_weights(
                attention_scores(dots[r, others], sq[o], sq[others], self.kernel, self.sigma), self.self_weight
            )
            xi[r, o], xi[r, others] = row[0], row[1:]
        return dict(zip(client_ids, mixing_average(columns, xi, keys=keys)))

    @override
    def extra_downlinks(
        self, client_ids: Sequence[int], server_round: int, task: str = "train"
    ) -> dict[int, dict[str, np.ndarray]]:
        if task != "train":  # the final evaluation needs none
            return {cid: {} for cid in client_ids}
        clouds = self.cloud_models(client_ids)
        return {c: {CLOUD_PREFIX + k: v for k, v in clouds[c].items()} for c in client_ids}

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        for u in updates:
            self.models[u.client_id] = u.arrays
        record: dict[str, Any] = {"stored_models": len(self.models)}
        m = len(updates)
        if m > 1:  # how far apart this round's personalized models are: RMS pairwise distance, O(m x params)
            record["model_distance_rms"] = float(
                np.sqrt(2.0 * spread([u.arrays for u in updates], list(self.model.global_arrays)) / (m - 1))
            )
        return record
