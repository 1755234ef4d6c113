"""Aggregation math on plain arrays (no Flower): unit-tested against hand-computed values."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

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


def layerwise_mix(
    models: Sequence[Arrays], alpha: np.ndarray, layer_keys: Sequence[Sequence[str]]
) -> dict[str, np.ndarray]:
    """One mix of ``models`` per layer: w^l = sum_j alpha[l, j] w_j^l (rows normalized), layer l's keys in
    ``layer_keys[l]``. pFedLA's personalized model; KAPC's regularizer s_i^l = sum_j R[i, l, j] w_j^l."""
    out: dict[str, np.ndarray] = {}
    for weights, keys in zip(np.asarray(alpha, dtype=np.float64), layer_keys):
        if keys:
            out.update(weighted_average(models, weights, keys=list(keys)))
    return out


def fedavg(updates: Sequence[Arrays], num_examples: Sequence[int]) -> dict[str, np.ndarray]:
    """FedAvg (McMahan et al.): the average weighted by each client's training-set size.

    Clients that uploaded different key sets (a client-chosen upload, BLS's prefixes): each key is
    the FedAvg of the clients that sent it.
    """
    keys = list(updates[0].keys())
    if all(len(u) == len(keys) and all(k in u for k in keys) for u in updates):
        return weighted_average(updates, num_examples)
    out: dict[str, np.ndarray] = {}
    for key in dict.fromkeys(k for u in updates for k in u):
        holders = [(u, n) for u, n in zip(updates, num_examples) if key in u]
        out.update(weighted_average([u for u, _ in holders], [n for _, n in holders], keys=[key]))
    return out


SCRATCH_BYTES = 16 * 2**20  # float64 scratch of one stacked block of models (column_blocks)


def column_blocks(
    models: Sequence[Arrays], keys: Sequence[str], extra_rows: int = 0, minus: Arrays | None = None
) -> Iterator[tuple[str, int, int, np.ndarray]]:
    """The models side by side in float64 blocks: ``(key, start, stop, block)`` with
    ``block[i] = models[i][key].reshape(-1)[start:stop]``, for every key in order.

    The products of the personalized aggregations (mixing, Gram matrices) run on these
    blocks, one BLAS call per block, so no (models x parameters) float64 matrix is ever built:
    a block holds at most ``SCRATCH_BYTES / 8 / (len(models) + extra_rows)`` columns
    (``extra_rows``: rows of the caller's result per column, to keep that bounded too).
    With ``minus``, row i holds ``models[i][key] - minus[key]`` computed in the models' dtype
    (the float32 update of :func:`strategies.shared.model_distance.difference`). The block is one
    reused buffer: it is valid until the next one is yielded.
    """
    m = len(models)
    if m == 0:
        return
    step = max(1, SCRATCH_BYTES // (8 * (m + extra_rows)))
    sizes = [int(np.size(models[0][k])) for k in keys]
    buffer = np.empty(m * min(step, max(sizes, default=1)))
    for key, size in zip(keys, sizes):
        flats = [np.asarray(w[key]).reshape(-1) for w in models]
        ref = None if minus is None else np.asarray(minus[key]).reshape(-1)
        for start in range(0, size, step):
            stop = min(size, start + step)
            block = buffer[: m * (stop - start)].reshape(m, stop - start)
            if ref is None:
                np.stack([flat[start:stop] for flat in flats], out=block, casting="same_kind")
            else:
                for row, flat in zip(block, flats):
                    np.subtract(flat[start:stop], ref[start:stop], out=row)
            yield key, start, stop, block


def distinct_columns(models: Sequence[Arrays], mixing: np.ndarray) -> tuple[list[Arrays], np.ndarray, np.ndarray]:
    """Merge columns that mix the same model object: ``(models, mixing, index)``, where the
    returned mixing sums the weights of repeated models (w a + w' a = (w + w') a) and
    ``index[j]`` is where input column j went. A method that stands in one default model for
    every client without a stored one (the warm-up model, the initial model) stacks it once.
    """
    position: dict[int, int] = {}
    index = np.array([position.setdefault(id(w), len(position)) for w in models], dtype=np.int64)
    if len(position) == len(models):
        return list(models), mixing, index
    unique: list[Arrays] = [None] * len(position)  # type: ignore[list-item]
    for w, j in zip(models, index):
        unique[j] = w
    merged = np.zeros((mixing.shape[0], len(unique)))
    np.add.at(merged.T, index, mixing.T)
    return unique, merged, index


def mixing_average(
    updates: Sequence[Arrays], mixing: np.ndarray, keys: Sequence[str] | None = None
) -> list[dict[str, np.ndarray]]:
    """Per-client averages: row i of ``mixing`` (rows normalized) weights every update for output i.

    ``mixing`` is k x m for m updates (k outputs: the round's participants for pFedSim and
    FedCMD Eq. 7, the next round's clients over all stored models for FedAMP, FedAP, pFedLA).
    Cost O(k x m x params) as one matrix product per block of :func:`column_blocks` (BLAS, not
    k x m vector operations); memory: the k outputs plus a bounded float64 scratch. Repeated
    model objects are stacked once (:func:`distinct_columns`).
    """
    mixing = np.asarray(mixing, dtype=np.float64)
    m = len(updates)
    if mixing.ndim != 2 or mixing.shape[1] != m:
        raise ValueError(f"mixing matrix must have one column per update ({m}), got shape {mixing.shape}")
    rows = np.stack([normalized_weights(row) for row in mixing])
    keys = list(updates[0].keys()) if keys is None else list(keys)
    updates, rows, _ = distinct_columns(updates, rows)
    out = [{k: np.empty(np.shape(updates[0][k]), np.asarray(updates[0][k]).dtype) for k in keys} for _ in rows]
    flat = [{k: o[k].reshape(-1) for k in keys} for o in out]
    for key, start, stop, block in column_blocks(updates, keys, extra_rows=len(rows)):
        mixed = rows @ block
        for f, row in zip(flat, mixed):
            f[key][start:stop] = row
    return out
