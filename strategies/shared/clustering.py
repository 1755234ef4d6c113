"""Clustering of clients from a similarity matrix, as plain functions (CFL's split; FedTSDP's
DBSCAN stages build on the same module)."""

from __future__ import annotations

import numpy as np


def bipartition(similarity: np.ndarray) -> tuple[list[int], list[int]]:
    """Two clusters of the items of a similarity matrix: agglomerative, complete linkage.

    Sattler et al.'s reference code runs scikit-learn's AgglomerativeClustering (complete
    linkage) on -S; this is the same merge sequence in plain numpy: start from singletons and
    repeatedly merge the two clusters whose *least* similar pair of members is the most
    similar, until two remain. The cut therefore keeps the largest cross-cluster similarity
    low (the paper's optimal bi-partition criterion). Ties merge the earliest pair. The
    cluster holding item 0 comes first; each list is sorted.

    A cluster lives on in the row of its first item. Each row caches its best partner among
    the later rows; a merge only refreshes the rows whose best partner was one of the two
    merged clusters (complete-linkage values only decrease), so a merge costs O(n) plus the
    refreshed rows, about O(n^2) in all instead of rescanning the whole matrix each time.
    """
    s = np.asarray(similarity, dtype=np.float64)
    n = len(s)
    if n < 2 or s.shape != (n, n):
        raise ValueError(f"bipartition needs a square similarity matrix of at least 2 items, got shape {s.shape}")
    link = s.copy()  # link[a, b] = the smallest similarity between a member of a and one of b
    members = {i: [i] for i in range(n)}
    active = np.ones(n, dtype=bool)
    best, partner = np.full(n, -np.inf), np.zeros(n, dtype=np.int64)

    def refresh(i: int) -> None:  # the first most similar active row after i (row-major tie rule)
        later = np.flatnonzero(active[i + 1 :]) + i + 1
        if len(later):
            j = int(np.argmax(link[i, later]))
            best[i], partner[i] = link[i, later[j]], later[j]
        else:
            best[i] = -np.inf

    for i in range(n):
        refresh(i)
    for _ in range(n - 2):
        a = int(np.argmax(np.where(active, best, -np.inf)))  # the earliest row holding the best pair
        b = int(partner[a])
        members[a] += members.pop(b)
        active[b], best[b] = False, -np.inf
        link[a], link[:, a] = np.minimum(link[a], link[b]), np.minimum(link[:, a], link[:, b])
        for i in np.flatnonzero(active & ((partner == a) | (partner == b))):
            refresh(int(i))
        refresh(a)
    first, second = (sorted(members[i]) for i in np.flatnonzero(active))
    return (first, second) if 0 in first else (second, first)


def cross_cosine_max(similarity: np.ndarray, halves: tuple[list[int], list[int]]) -> float:
    """The largest similarity between an item of one half and one of the other (CFL's
    alpha_cross_max: a bi-partition separates incongruent clients when it is low)."""
    first, second = halves
    return float(np.asarray(similarity)[np.ix_(first, second)].max())


def groups_by_label(labels: dict[int, object]) -> list[list[int]]:
    """Clients with equal labels, as sorted member lists, ordered by their smallest member.

    FedCPMD's clusters are the clients that chose the same layer; any "same key, same
    cluster" rule is this.
    """
    out: dict[object, list[int]] = {}
    for cid in sorted(labels):
        out.setdefault(labels[cid], []).append(cid)
    return sorted(out.values(), key=lambda m: m[0])
