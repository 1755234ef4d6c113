"""Inner products, distances and cosines between whole models, on plain arrays (no Flower).

A model is a mapping key -> array; the vector of a model is its ``keys`` flattened and
concatenated in order. The Gram matrix is accumulated one bounded block of parameters at a
time (:func:`~strategies.shared.aggregation.column_blocks`, one BLAS product each), so no
(clients x parameters) matrix of whole models is ever built. FedAMP (attention over model
distances), CFL (cosine similarity of updates) and FedCMD (Eq. 8) use it. Also: the
checkpoint form of the per-client model stores several methods keep.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .aggregation import column_blocks, normalized_weights

Arrays = Mapping[str, np.ndarray]


def inner_products(a: Sequence[Arrays], b: Sequence[Arrays], keys: Sequence[str]) -> np.ndarray:
    """P_ij = <a_i, b_j> over ``keys`` (float64): a len(a) x len(b) matrix.

    One matrix product per block of :func:`~strategies.shared.aggregation.column_blocks` (a and b
    stacked once, side by side): O(len(a) x len(b) x params) in BLAS, bounded scratch.
    """
    same = b is a
    models = list(a) if same else [*a, *b]
    out = np.zeros((len(a), len(b)))
    for *_, block in column_blocks(models, keys):
        left = block[: len(a)]
        out += left @ (left if same else block[len(a) :]).T
    return out


def gram_matrix(models: Sequence[Arrays], keys: Sequence[str]) -> np.ndarray:
    """G_ij = <w_i, w_j> over ``keys`` (float64), for m models: an m x m matrix."""
    return inner_products(models, models, keys)


def squared_norms(models: Sequence[Arrays], keys: Sequence[str]) -> np.ndarray:
    """||w_i||^2 over ``keys`` for every model (the Gram diagonal without the rest of it)."""
    return np.array([sum(float(np.sum(np.asarray(w[k], dtype=np.float64) ** 2)) for k in keys) for w in models])


def update_statistics(
    models: Sequence[Arrays], reference: Arrays, weights: Sequence[float], keys: Sequence[str]
) -> tuple[np.ndarray, float]:
    """For the updates dW_i = models[i] - reference (float32, as :func:`difference`): their Gram
    matrix and ||sum_i w_i dW_i|| (w normalized; the mean update, rounded to the models'
    dtype as :func:`~strategies.shared.aggregation.weighted_average` returns it).

    CFL's per-round statistics without building the updates: O(m^2 x params) for the Gram
    (one matrix product per block), O(m x params) for the mean, bounded scratch.
    """
    w = normalized_weights(weights)
    gram = np.zeros((len(models), len(models)))
    mean_sq = 0.0
    for key, _, _, block in column_blocks(models, keys, minus=reference):
        gram += block @ block.T
        mean = (w @ block).astype(np.asarray(models[0][key]).dtype).astype(np.float64)
        mean_sq += float(mean @ mean)
    return gram, float(np.sqrt(mean_sq))


def spread(models: Sequence[Arrays], keys: Sequence[str]) -> float:
    """sum_i ||w_i - mean||^2 over ``keys`` (plain mean, float64): O(m x params).

    The mean squared pairwise distance of m models is 2 / (m - 1) times this, so a round's
    typical distance needs no m x m pass over the parameters.
    """
    total = 0.0
    for *_, block in column_blocks(models, keys):
        dev = block - block.mean(axis=0)
        total += float(np.einsum("ij,ij->", dev, dev))
    return total


def difference(a: Arrays, b: Arrays, keys: Sequence[str]) -> dict[str, np.ndarray]:
    """a - b over ``keys`` (float32 like the model tensors; FedDyn, CFL's updates)."""
    return {k: np.asarray(a[k], dtype=np.float32) - np.asarray(b[k], dtype=np.float32) for k in keys}


def copy_arrays(arrays: Arrays) -> dict[str, np.ndarray]:
    """Independent copies (for stores a strategy keeps and checkpoints)."""
    return {k: np.array(v, copy=True) for k, v in arrays.items()}
