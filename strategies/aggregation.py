"""Aggregation math on plain arrays (no Flower): unit-tested against hand-computed values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

Arrays = Mapping[str, np.ndarray]


def normalized_weights(weights: Sequence[float]) -> np.ndarray:
    """Weights scaled to sum to 1; raises on negative, non-finite or all-zero weights."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) == 0:
        raise ValueError("need at least one weight")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"weights must be finite and >= 0, got {w.tolist()}")
    total = w.sum()
    if total <= 0:
        raise ValueError("weights sum to zero")
    return w / total


def weighted_average(
    updates: Sequence[Arrays], weights: Sequence[float], keys: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """Sum_i w_i * update_i per key (w normalized). One pass, O(clients x params), no stacking.

    ``keys`` defaults to the keys of the first update; every update must hold them.
    """
    if len(updates) != len(weights):
        raise ValueError(f"{len(updates)} updates but {len(weights)} weights")
    w = normalized_weights(weights)
    keys = list(updates[0].keys()) if keys is None else list(keys)
    out: dict[str, np.ndarray] = {}
    for key in keys:
        first = updates[0][key]
        acc = np.zeros(first.shape, dtype=np.float64)
        for wi, upd in zip(w, updates):
            acc += wi * upd[key]
        out[key] = acc.astype(first.dtype, copy=False)
    return out


def fedavg(updates: Sequence[Arrays], num_examples: Sequence[int]) -> dict[str, np.ndarray]:
    """FedAvg (McMahan et al.): the average weighted by each client's training-set size."""
    return weighted_average(updates, num_examples)


def mixing_average(
    updates: Sequence[Arrays], mixing: np.ndarray, keys: Sequence[str] | None = None
) -> list[dict[str, np.ndarray]]:
    """Per-client averages: row i of ``mixing`` (rows normalized) weights every update for client i.

    The personalized aggregations (pFedSim, FedCMD Eq. 7, FedAMP) are this with different
    mixing matrices. Cost O(m^2 x params) for m updates, done as one matrix product per key.
    """
    mixing = np.asarray(mixing, dtype=np.float64)
    m = len(updates)
    if mixing.shape != (m, m):
        raise ValueError(f"mixing matrix must be {m}x{m}, got {mixing.shape}")
    rows = np.stack([normalized_weights(row) for row in mixing])
    keys = list(updates[0].keys()) if keys is None else list(keys)
    out: list[dict[str, np.ndarray]] = [{} for _ in range(m)]
    for key in keys:
        stacked = np.stack([u[key].reshape(-1) for u in updates]).astype(np.float64)
        mixed = rows @ stacked
        shape, dtype = updates[0][key].shape, updates[0][key].dtype
        for i in range(m):
            out[i][key] = mixed[i].reshape(shape).astype(dtype, copy=False)
    return out
