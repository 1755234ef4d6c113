"""KAPC's server math on plain arrays (KAPC paper, algorithm): the relationship cube.

R is an N x L x N array: R[i, l, j] is the weight client i gives client j's layer l. Its rows
R[i, l, :] are non-negative and sum to 1. Each round the participants' slice of R (M x L x M,
rows renormalized) takes ``steps`` gradient steps on

    lambda * sum_l ||R^l X^l - X^l||^2  +  beta/2 * ||R^l - 1/M||^2      (X^l: M x P_l, row j = w_j^l)

whose gradient needs only the layer Gram matrices G^l = X^l X^l^T (M x M):
``2 lambda (R^l G^l - G^l) + beta (R^l - 1/M)`` (Eq. 12). The regularizer of client i is
s_i^l = sum_j R[i, l, j] w_j^l (Eq. 34): one mixing product per layer for all participants.

The step size (``lr``). Rows of R sum to 1, so R^l X - X = (R^l - I)(X - 1 m^T) for any m: the
objective sees only the clients' deviations from their mean, never the part all clients share.
The raw Gram is dominated by that shared part (every client starts from one w^0: on KAPC's
FMNIST CNN its top eigenvalue is 30 to 1700, the centred Gram's 0.03 to 0.2), which adds only a
constant to each row of the gradient (no move within the simplex) and makes both the paper's
0.01 and Theorem 1's 1 / (beta + 2 lambda lambda_max(G^l)) steps far too small for R to leave its
start: mean |dR| over a 50-round run was 0.013. ``lr="centered"`` (the default) steps with the
centred Gram C G^l C (C = I - 11^T/M), which gives the same objective and the gradient's
component within the simplex, with Theorem 1's step for it, 1 / (beta + 2 lambda
lambda_max(C G^l C)): the step the theorem's smoothness constant allows where R can move.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ROW_EPS = 1e-12


def project_rows(r: np.ndarray) -> np.ndarray:
    """Clamp at 0 and divide each row (last axis) by its sum; a row summing to ~0 becomes uniform."""
    r = np.maximum(np.asarray(r, dtype=np.float64), 0.0)
    sums = r.sum(axis=-1, keepdims=True)
    uniform = np.full_like(r, 1.0 / r.shape[-1])
    return np.where(sums > ROW_EPS, r / np.where(sums > ROW_EPS, sums, 1.0), uniform)


def cube_gradient(r: np.ndarray, gram: np.ndarray, lam: float, beta: float) -> np.ndarray:
    """d/dR^l of lambda ||R^l X^l - X^l||^2 + beta/2 ||R^l - 1/M||^2 (rows: clients i, columns j), for
    one layer (M x M) or all layers at once (L x M x M with ``gram`` L x M x M)."""
    m = r.shape[-1]
    return 2.0 * lam * (r @ gram - gram) + beta * (r - 1.0 / m)


def centered(gram: np.ndarray) -> np.ndarray:
    """C G C with C = I - 11^T/M (per layer): the Gram of the clients' deviations from their mean."""
    gram = np.asarray(gram, dtype=np.float64)
    row = gram.mean(axis=-1, keepdims=True)
    col = gram.mean(axis=-2, keepdims=True)
    return gram - row - col + gram.mean(axis=(-2, -1), keepdims=True)


def theory_lr(gram: np.ndarray, lam: float, beta: float) -> np.ndarray:
    """eta^l = 1 / (beta + 2 lambda lambda_max(G^l)) per layer (Thm 1's step size)."""
    top = np.linalg.eigvalsh(np.asarray(gram, dtype=np.float64))[..., -1]
    return 1.0 / (beta + 2.0 * lam * np.maximum(top, 0.0))


CUBE_INITS = ("random", "uniform")  # R^0
CUBE_LRS = ("centered", "theory")  # the named step sizes; a number is a fixed step


def cube_step(
    r: np.ndarray, grams: np.ndarray, lam: float, beta: float, lr: float | str = "centered", steps: int = 1
) -> np.ndarray:
    """``steps`` projected gradient steps on the participants' slice ``r`` (M x L x M) from the layer
    Grams (L x M x M). ``lr``: ``"centered"`` (the centred Gram and its Theorem-1 step, see the
    module docstring), ``"theory"`` (the raw Gram's Theorem-1 step, :func:`theory_lr`), or a number
    (a fixed step on the raw Gram: the paper's 0.01)."""
    layer_first = np.transpose(np.asarray(r, dtype=np.float64), (1, 0, 2))  # L x M x M
    grams = np.asarray(grams, dtype=np.float64)
    if lr == "centered":
        grams = centered(grams)
    eta = theory_lr(grams, lam, beta)[:, None, None] if lr in CUBE_LRS else float(lr)
    for _ in range(steps):
        layer_first = project_rows(layer_first - eta * cube_gradient(layer_first, grams, lam, beta))
    return np.transpose(layer_first, (1, 0, 2))


def slice_rows(cube: np.ndarray, ids: Sequence[int]) -> np.ndarray:
    """The participants' block R[C][:, :, C] with rows renormalized (ALG5 line 6)."""
    ids = np.asarray(ids, dtype=np.int64)
    return project_rows(cube[np.ix_(ids, np.arange(cube.shape[1]), ids)])


def write_back(cube: np.ndarray, ids: Sequence[int], block: np.ndarray, mode: str = "scaled") -> None:
    """Put a participants' block back into the cube (in place). ``scaled`` (default): each row
    block keeps the mass it had among the participants, so every full row still sums to 1 and the
    non-participants' entries keep their weight. ``literal``: write, then renormalize the rows."""
    ids = np.asarray(ids, dtype=np.int64)
    index = np.ix_(ids, np.arange(cube.shape[1]), ids)
    if mode == "scaled":
        mass = cube[index].sum(axis=-1, keepdims=True)
        cube[index] = block * mass
    elif mode == "literal":
        cube[index] = block
        cube[ids] = project_rows(cube[ids])
    else:
        raise ValueError(f"KAPC write_back must be scaled or literal, got {mode!r}")


def downlink_mask(
    block: np.ndarray, mu: float | None, first: Sequence[bool], prefix: Sequence[int] | None = None
) -> np.ndarray:
    """mask[i, l] = 1 when layer l of client i's regularizer is sent (ALG3): unless its self-weight
    R[i, l, i] > mu; a client's first participation gets every layer ([R]). mu None: all.

    ``prefix[i]``: the number of layers client i uploaded last time (its Omega). Eq. 20's partial
    regularizer coaches the layers after Omega toward the client's own weights, so they are not
    sent (the client trains them toward its round-start values, as for a masked layer)."""
    m, layers, _ = block.shape
    mask = np.ones((m, layers), dtype=bool)
    if mu is not None:
        self_weight = block[np.arange(m), :, np.arange(m)]  # M x L
        mask = self_weight <= mu
    if prefix is not None:
        mask &= np.arange(layers)[None, :] < np.asarray(prefix, dtype=np.int64)[:, None]
    mask[np.asarray(first, dtype=bool)] = True
    return mask


def heard_mixing(weights: np.ndarray, heard: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    """One layer's mixing rows (M x M) restricted to the co-participants whose layer the server
    has received (``heard``), renormalized. Returns (weights, sendable): a row with no heard
    co-participant has nothing to coach with, so its layer is not sent (the client coaches it
    toward its own start, as for a masked layer); such a row is returned as it was. Everyone
    heard: the rows as they are, same bits."""
    w = np.asarray(weights, dtype=np.float64)
    known = np.asarray(heard, dtype=bool)
    if known.all():
        return w, np.ones(len(w), dtype=bool)
    kept = w * known[None, :]
    total = kept.sum(axis=1)
    sendable = total > ROW_EPS
    return np.where(sendable[:, None], kept / np.where(sendable, total, 1.0)[:, None], w), sendable


def initial_cube(n: int, layers: int, rng: np.random.Generator, kind: str = "random") -> np.ndarray:
    """R^0: U[0, 1) with rows normalized ("randomly"), or exactly uniform."""
    if kind == "uniform":
        return np.full((n, layers, n), 1.0 / n)
    if kind != "random":
        raise ValueError(f"KAPC cube_init must be random or uniform, got {kind!r}")
    return project_rows(rng.random((n, layers, n)))
