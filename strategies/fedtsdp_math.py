"""FedTSDP's server-side math as plain functions (FedTSDP paper, algorithm): Jensen-Shannon matrix,
Hopkins statistic, DBSCAN with noise as singletons, the two-stage clustering, the amended
sampling of the public batch and the shared-unit decay.

Everything takes numpy arrays and an explicit ``numpy.random.Generator``, so the strategy's
randomness is one checkpointed generator and every function is testable without Flower.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

DECAY_MODES = ("float", "int")
RADIUS_MODES = (
    "absolute",
    "median",
)  # how eps2 is read: a distance, or a fraction of the participants' median distance


def js_matrix(probs: np.ndarray) -> np.ndarray:
    """Pairwise Jensen-Shannon divergence of clients' softmax outputs, averaged over the batch.

    ``probs``: [m, B, C], each row a distribution over C classes. Natural log: values in
    [0, ln 2], not square-rooted (the FedTSDP paper's divergence; scipy's ``jensenshannon`` is the root).
    Symmetric with a zero diagonal. O(m^2 B C) in chunks of one client against all.
    """
    p = np.asarray(probs, dtype=np.float64)
    m = len(p)
    plogp = _xlogx(p).sum(axis=2)  # [m, B]: sum_c p log p
    out = np.zeros((m, m))
    for i in range(m):
        mid = 0.5 * (p[i][None] + p)  # [m, B, C]
        # JS = 1/2 KL(p||M) + 1/2 KL(q||M) = 1/2 (sum p log p + sum q log q) - sum M log M
        js = 0.5 * (plogp[i][None] + plogp) - _xlogx(mid).sum(axis=2)
        out[i] = np.clip(js, 0.0, math.log(2.0)).mean(axis=1)
    out = 0.5 * (out + out.T)
    np.fill_diagonal(out, 0.0)
    return out


def _xlogx(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def hopkins(points: np.ndarray, m_tilde: int, rng: np.random.Generator) -> float:
    """Hopkins statistic (eq. 6, FedTSDP paper, Hopkins statistic (eq. 6)): ~0.5 for no structure, -> 1 for clusters.

    ``m_tilde`` real points (without replacement) and as many uniform points in the data's
    bounding box; z: uniform point -> nearest real point, v: real point -> nearest *other*
    real point; H = sum z / (sum z + sum v), 0 when both are 0 (all points equal). Fewer than
    3 points: 0 (no clustering).
    """
    from sklearn.neighbors import NearestNeighbors

    x = np.asarray(points, dtype=np.float64)
    m = len(x)
    if m < 3:
        return 0.0
    k = int(min(max(1, m_tilde), m - 1))
    idx = rng.choice(m, k, replace=False)
    lo, hi = x.min(axis=0), x.max(axis=0)
    uniform = rng.uniform(lo, hi, size=(k, x.shape[1]))
    nn = NearestNeighbors(n_neighbors=2).fit(x)
    z = nn.kneighbors(uniform, n_neighbors=1)[0][:, 0]
    v = nn.kneighbors(x[idx], n_neighbors=2)[0][:, 1]  # the first neighbour is the point itself
    den = float(z.sum() + v.sum())
    return 0.0 if den == 0.0 else float(z.sum()) / den


def default_m_tilde(m: int) -> int:
    """max(2, round(0.1 m)), at most m - 1."""
    return max(1, min(max(2, round(0.1 * m)), m - 1))


def dbscan_groups(distances: np.ndarray, eps: float, min_pts: int) -> list[list[int]]:
    """DBSCAN on a precomputed distance matrix; every noise point its own singleton.

    Groups are sorted lists of row indices, ordered by their smallest member. ``eps = inf``
    puts every point in one group.
    """
    from sklearn.cluster import DBSCAN

    d = np.asarray(distances, dtype=np.float64)
    n = len(d)
    if n == 0:
        return []
    if math.isinf(eps):
        return [list(range(n))]
    labels = DBSCAN(eps=eps, min_samples=min_pts, metric="precomputed").fit_predict(d)
    groups: dict[int, list[int]] = {}
    singles = []
    for i, label in enumerate(labels):
        if label < 0:
            singles.append([i])
        else:
            groups.setdefault(int(label), []).append(i)
    return sorted([*groups.values(), *singles], key=lambda g: g[0])


def weight_distances(vectors: np.ndarray, upsilon: float = 1e-6) -> np.ndarray:
    """||w_i - w_j + upsilon||_2 for all pairs (eq. 9; torch ``pairwise_distance`` with eps),
    symmetrized, zero diagonal. ``vectors``: [m, P] flattened trainable parameters."""
    w = np.asarray(vectors, dtype=np.float64)
    return weight_distances_from_gram(w @ w.T, w.sum(axis=1), w.shape[1], upsilon)


def weight_distances_from_gram(gram: np.ndarray, sums: np.ndarray, count: int, upsilon: float = 1e-6) -> np.ndarray:
    """:func:`weight_distances` from the models' Gram matrix, their element sums and the
    parameter count: the server never stacks m whole models (100 ResNet18s are 4.5 GB)."""
    gram, s = np.asarray(gram, dtype=np.float64), np.asarray(sums, dtype=np.float64)
    sq = np.diag(gram)
    # ||a - b + u||^2 = ||a||^2 + ||b||^2 - 2 a.b + 2u (sum a - sum b) + p u^2
    d2 = sq[:, None] + sq[None, :] - 2.0 * gram + 2.0 * upsilon * (s[:, None] - s[None, :]) + count * upsilon**2
    d = np.sqrt(np.clip(d2, 0.0, None))
    d = 0.5 * (d + d.T)
    np.fill_diagonal(d, 0.0)
    return d


def stage2_radius(distances: np.ndarray, eps2: float, mode: str = "absolute") -> float:
    """The DBSCAN radius of stage 2, from the weight distances of all participants of the
    re-clustering. ``absolute``: eps2 itself (the paper's, a distance in the units of the model's
    weights). ``median``: eps2 times the median pair distance, so one setting carries across
    rounds and seeds while the distances shrink as training goes on (about tenfold over a
    200-round FMNIST run). Over all participants, not per stage-1 group: a tight group stays
    whole, and a group of three does not set its radius from its own three pairs."""
    if mode not in RADIUS_MODES:
        raise ValueError(f"FedTSDP eps2 mode must be one of {list(RADIUS_MODES)}, got {mode!r}")
    if mode == "absolute" or math.isinf(eps2):
        return float(eps2)
    pairs = upper_pairs(distances)
    return float(eps2 * np.median(pairs)) if pairs.size else float(eps2)


def two_stage(
    js: np.ndarray, weight_distance: Callable[[Sequence[int]], np.ndarray], eps1: float, eps2: float, min_pts: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Stage 1: DBSCAN on the JS matrix; stage 2: DBSCAN at radius ``eps2`` on weight distances
    inside each stage-1 group of two or more. Returns (stage-1 groups, flattened stage-2 groups),
    as row indices. ``weight_distance(rows)`` gives the distance matrix of those rows."""
    first = dbscan_groups(js, eps1, min_pts)
    second: list[list[int]] = []
    for group in first:
        if len(group) == 1 or math.isinf(eps2):
            second.append(group)
            continue
        for sub in dbscan_groups(weight_distance(group), eps2, min_pts):
            second.append([group[i] for i in sub])
    return first, sorted(second, key=lambda g: g[0])


def upper_pairs(matrix: np.ndarray) -> np.ndarray:
    """The pairs of a symmetric distance matrix (its upper triangle, diagonal left out)."""
    m = np.asarray(matrix, dtype=np.float64)
    return m[np.triu_indices(len(m), k=1)]


def pair_spread(pairs: Sequence[float] | np.ndarray) -> dict[str, float]:
    """Min, median and max of pair distances: what a DBSCAN radius (eps1 on JS, eps2 on weight
    distance) must be set against. No pairs: empty."""
    values = np.asarray(pairs, dtype=np.float64)
    if values.size == 0:
        return {}
    return {"min": float(values.min()), "median": float(np.median(values)), "max": float(values.max())}


def draw_batch(weights: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` distinct public indices drawn with probability proportional to ``weights``, sorted."""
    w = np.asarray(weights, dtype=np.float64)
    size = min(int(size), int(np.count_nonzero(w)))
    return np.sort(rng.choice(len(w), size=size, replace=False, p=w / w.sum()))


def amend_weights(weights: np.ndarray, batch: np.ndarray, increment: float) -> np.ndarray:
    """Eqs. 7-8: raise the weights of the triggering batch by ``increment`` and renormalize."""
    w = np.asarray(weights, dtype=np.float64).copy()
    w[batch] += increment
    return w / w.sum()


def decay_shared(units: float, psi: float, mode: str = "float") -> float:
    """Eq. 11: the shared-unit counter after a trigger: ``units * psi`` (``float``: kept as a
    float, S = floor) or ``int(units * psi)`` (``int``: at least one unit fewer each time)."""
    if mode not in DECAY_MODES:
        raise ValueError(f"FedTSDP decay mode must be one of {list(DECAY_MODES)}, got {mode!r}")
    value = units * psi
    if mode == "int":
        return float(min(int(value), max(int(units) - 1, 0)))
    return value
