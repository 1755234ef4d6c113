"""FedPAC (Xu, Tong, Huang, ICLR 2023): FedAvg of the feature extractor, global class prototypes
the clients align their features to, and for each client of the round a classifier combined
from the round's classifiers with the weights that minimise its estimated test loss (its role:
:mod:`pflower.client_app.roles.fedpac`).

The combination for client i (the paper's classifier collaboration): with the round's clients
j = 1..m, their statistics v_j and h_j [C, D] (the role's docstring), solve

    min_a  a^T (diag(v) + D_i) a,   a >= 0, sum(a) = 1,   D_i[j, k] = sum_c (h_i[c] - h_j[c]) . (h_i[c] - h_k[c]),

drop the weights under 1e-3, renormalise, and send client i the classifier sum_j a_j phi_j the
next time it takes part (and with the final evaluation). The matrix is positive semi-definite
(a Gram matrix plus a non-negative diagonal); where rounding leaves a negative eigenvalue, the
eigenvalues under 0.01 are dropped first, and client i keeps its own classifier if that does not
help (FL-bench's code, whose quadratic program this is; it solves it with cvxpy, here scipy's
SLSQP on the same problem).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import minimize
from typing_extensions import override

from pflower.client_app.roles.fedpac import HEAD, STATS, FedPACArgs
from pflower.client_app.roles.fedproto import PROTO
from pflower.protocol.options import option

from .base.hooks import MethodTraits, Uplink
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate
from .fedproto import WEIGHTINGS, aggregate_prototypes

SMALL_WEIGHT = 1e-3  # combination weights under this are dropped (FL-bench)
EIGEN_FLOOR = 0.01  # eigenvalues under this are dropped from a matrix that is not PSD (FL-bench)


def combination_matrix(i: int, v: np.ndarray, h: np.ndarray) -> np.ndarray:
    """diag(v) + D_i for client ``i`` of the round (``v`` [m], ``h`` [m, C, D])."""
    diff = (h[i][None] - h).reshape(len(h), -1)  # [m, C * D]: h_i - h_j, flattened
    return np.diag(v) + diff @ diff.T


def simplex_quadratic_min(P: np.ndarray) -> np.ndarray:
    """argmin a^T P a over the probability simplex (SLSQP from the uniform point)."""
    m = len(P)
    result = minimize(
        lambda a: float(a @ P @ a),
        np.full(m, 1.0 / m),
        jac=lambda a: (P + P.T) @ a,
        method="SLSQP",
        bounds=[(0.0, 1.0)] * m,
        constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1.0, "jac": lambda a: np.ones_like(a)}],
        options={"ftol": 1e-12, "maxiter": 500},
    )
    return np.clip(result.x, 0.0, None)


def combination_weights(i: int, v: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Client ``i``'s weights over the round's classifiers (the module docstring)."""
    P = combination_matrix(i, np.asarray(v, np.float64), np.asarray(h, np.float64))
    P = (P + P.T) / 2
    own = np.eye(len(P))[i]
    values, vectors = np.linalg.eigh(P)
    if values.min() < 0:
        keep = values >= EIGEN_FLOOR
        P = (vectors[:, keep] * values[keep]) @ vectors[:, keep].T
        if np.linalg.eigvalsh(P).min() < -1e-12:
            return own
    a = simplex_quadratic_min(P)
    a = np.where(a > SMALL_WEIGHT, a, 0.0)
    return a / a.sum() if a.sum() > 0 else own


@dataclass(frozen=True)
class FedPACOptions(FedPACArgs):
    """FedPAC's options (``method.<name>=``, keywords of ``FedPAC(...)``); the client's are
    :class:`~pflower.client_app.roles.fedpac.FedPACArgs`."""

    proto_weighting: str = option(
        "examples",
        "the global prototypes: examples: each reply by its examples of the class (FL-bench) | clients: each alike "
        "(PFLlib)",
        choices=WEIGHTINGS,
    )


class FedPAC(PersonalizedStrategy):
    """Feature alignment and classifier collaboration (options: :class:`FedPACOptions`)."""

    name = "fedpac"
    options_type = FedPACOptions
    traits = MethodTraits(role="fedpac", linear_head=True, state=("prototypes", "known", "heads"))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        schema = self.model.schema()
        self.head_group = schema.groups[-1]
        self.head_keys = list(schema.group_keys[self.head_group])
        weight = next(k for k in self.head_keys if len(schema.template[k][0]) == 2)
        self.num_classes, self.feature_dim = (int(d) for d in schema.template[weight][0])
        self.prototypes = np.zeros((self.num_classes, self.feature_dim), np.float32)
        self.known = np.zeros(self.num_classes, np.uint8)
        self.heads: dict[int, dict[str, np.ndarray]] = {}  # each client's combined classifier, for its next round

    @override
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return [self.head_group]  # the classifier is the client's; the server sends it a combination

    @override
    def extra_downlinks(
        self, client_ids: Sequence[int], server_round: int, task: str = "train"
    ) -> dict[int, dict[str, np.ndarray]]:
        protos = {PROTO + "S": self.prototypes, PROTO + "M": self.known} if task == "train" and self.known.any() else {}
        return {cid: {**protos, **{HEAD + k: v for k, v in self.heads.get(cid, {}).items()}} for cid in client_ids}

    @override
    def uplink(self, client_id: int, server_round: int) -> Uplink:
        c, d = self.num_classes, self.feature_dim
        template = self.model.template_of(client_id)
        extra = {
            PROTO + "s": ((c, d), np.dtype(np.float32)),
            PROTO + "n": ((c,), np.dtype(np.int64)),
            STATS + "v": ((1,), np.dtype(np.float64)),
            STATS + "h": ((c, d), np.dtype(np.float32)),
            **{HEAD + k: (tuple(template[k][0]), np.dtype(np.float32)) for k in self.head_keys},
        }
        return replace(super().uplink(client_id, server_round), extra=extra)

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """FedAvg of the body; the global prototypes; every replying client's combined classifier."""
        record = super().aggregate(server_round, updates)
        if not updates:
            return record
        ordered = sorted(updates, key=lambda u: u.client_id)
        self.prototypes, self.known = aggregate_prototypes(
            [u.extra[PROTO + "s"] for u in ordered],
            [u.extra[PROTO + "n"] for u in ordered],
            self.options.proto_weighting,
        )
        v = np.array([float(u.extra[STATS + "v"][0]) for u in ordered])
        h = np.stack([u.extra[STATS + "h"] for u in ordered])
        heads = [{k: np.asarray(u.extra[HEAD + k], np.float64) for k in self.head_keys} for u in ordered]
        own_share = []
        for i, u in enumerate(ordered):
            a = combination_weights(i, v, h)
            own_share.append(float(a[i]))
            self.heads[u.client_id] = {
                k: sum(w * head[k] for w, head in zip(a, heads)).astype(np.float32) for k in self.head_keys
            }
        record.update(
            {
                "known_classes": int(self.known.sum()),
                "own_head_weight": float(np.mean(own_share)),
                "log_keys": ["known_classes", "own_head_weight"],
            }
        )
        return record
