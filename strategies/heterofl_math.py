"""HeteroFL's server math (HeteroFL paper, "Heterogeneous federated learning"): sub-models as leading
blocks of the global tensors, and the average of each global entry over the clients that hold it.

A client of width rate r holds, of every global tensor of shape (d0, d1, ...), the block
[:s0, :s1, ...] with s the shape of its own tensor (the first ceil(r d) output units and the first
inputs). After training, each global entry becomes the weighted mean of the values the clients
that hold it sent; an entry no client held keeps its value. With label splits (the paper's
non-IID training), the classifier's row of a class counts only for the clients that have the
class (their masked loss never trains the others).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def leading_block(shape: Sequence[int]) -> tuple[slice, ...]:
    """The index of a sub-model tensor of ``shape`` inside its global tensor: [:s0, :s1, ...]."""
    return tuple(slice(0, int(s)) for s in shape)


def fits_inside(sub: Sequence[int], full: Sequence[int]) -> bool:
    """Whether a tensor of shape ``sub`` is a leading block of one of shape ``full``."""
    return len(sub) == len(full) and all(0 <= int(a) <= int(b) for a, b in zip(sub, full))


def slice_arrays(arrays: Mapping[str, np.ndarray], shapes: Mapping[str, Sequence[int]]) -> dict[str, np.ndarray]:
    """The sub-model of ``shapes`` cut from the global ``arrays`` (copies: a client may write them)."""
    return {key: np.array(arrays[key][leading_block(shape)]) for key, shape in shapes.items()}


def partial_average(
    global_arrays: Mapping[str, np.ndarray],
    updates: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float],
    row_masks: Sequence[Mapping[str, np.ndarray] | None] | None = None,
) -> dict[str, np.ndarray]:
    """Each global entry: the ``weights``-weighted mean of the values the updates hold for it.

    ``updates[i][key]`` is a leading block of ``global_arrays[key]``; ``row_masks[i][key]`` (a
    boolean vector over the block's first axis, optional) says which of its rows client i counts
    for (HeteroFL's label split on the classifier). An entry no update counts for keeps its
    global value. Returns new arrays for the keys any update holds (others are not returned).
    """
    if len(updates) != len(weights):
        raise ValueError(f"{len(updates)} updates but {len(weights)} weights")
    masks = list(row_masks) if row_masks is not None else [None] * len(updates)
    keys = sorted({k for u in updates for k in u})
    out: dict[str, np.ndarray] = {}
    for key in keys:
        full = np.asarray(global_arrays[key])
        held = [(u[key], w, m) for u, w, m in zip(updates, weights, masks) if key in u]
        # each holder's weight per entry, zero where its row mask says it does not count
        shares = []
        for value, weight, mask in held:
            if not fits_inside(np.shape(value), full.shape):
                raise ValueError(
                    f"{key}: a client's tensor {np.shape(value)} is not a block of the global {full.shape}"
                )
            share = np.full(np.shape(value), float(weight))
            rows = None if mask is None else mask.get(key)
            if rows is not None:
                share[~np.asarray(rows, bool)[: share.shape[0]]] = 0.0
            shares.append(share)
        count = np.zeros(full.shape, np.float64)
        for (value, _, _), share in zip(held, shares):
            count[leading_block(np.shape(value))] += share
        counted = count > 0
        # normalise first, then sum (FedAvg's order: at full width and FedAvg's weights the same bits)
        total = np.zeros(full.shape, np.float64)
        for (value, _, _), share in zip(held, shares):
            block = leading_block(np.shape(value))
            total[block] += np.divide(share, count[block], out=np.zeros_like(share), where=count[block] > 0) * value
        merged = full.astype(np.float64).copy()
        merged[counted] = total[counted]
        out[key] = merged.astype(full.dtype)
    return out
