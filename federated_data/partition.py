"""Partitioners: which pooled sample indices each client holds.

``iid`` and ``shards`` use flwr-datasets' partitioners. ``dirichlet`` is FL-bench's
protocol (the one the papers' tables were produced with): flwr-datasets'
``DirichletPartitioner`` gives up after 10 redraws, while the FedCMD/FedCPMD set-up
(N=100, alpha=0.1, at least 40 samples per client) needs more, so it is written here.
"""

from __future__ import annotations

import warnings

import numpy as np

PARTITIONERS = ("iid", "dirichlet", "shards", "file")  # file: partition_file.py
MAX_REDRAWS = 10_000


class PartitionError(ValueError):
    """The requested partition cannot be built from this dataset."""


def partition(
    labels: np.ndarray,
    method: str,
    num_clients: int,
    seed: int,
    alpha: float = 0.5,
    min_size: int = 40,
    self_balancing: bool = True,
    shards_per_client: int = 2,
) -> list[np.ndarray]:
    """Indices into ``labels`` for each client; deterministic for a given seed."""
    labels = np.asarray(labels)
    if method == "file":
        raise PartitionError("partition=file is read, not drawn: use partition_file.read_partition_file")
    if method not in PARTITIONERS:
        raise PartitionError(f"unknown partitioner {method!r}; valid partitioners: {list(PARTITIONERS)}")
    if num_clients < 1:
        raise PartitionError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > len(labels):
        raise PartitionError(
            f"{num_clients} clients but only {len(labels)} samples: lower num_clients or use a larger dataset"
        )
    if method == "dirichlet":
        if not alpha > 0:
            raise PartitionError(f"Dirichlet alpha must be > 0, got {alpha}")
        if num_clients * min_size > len(labels):
            raise PartitionError(
                f"{num_clients} clients x min_size {min_size} = {num_clients * min_size} "
                f"samples needed but the dataset has {len(labels)}: lower num_clients or "
                "partition.min_size"
            )
        return dirichlet(labels, num_clients, alpha, min_size, seed, self_balancing)
    return _flwr_datasets_partition(labels, method, num_clients, seed, shards_per_client)


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    min_size: int,
    seed: int,
    self_balancing: bool = True,
) -> list[np.ndarray]:
    """FL-bench ``dirichlet()``: per class, split by p ~ Dir(alpha), redraw until every client has ``min_size``.

    With ``self_balancing`` a client that already holds ``len(labels)/num_clients``
    samples gets no more (the cap in FL-bench and in the original LDA code).
    """
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    by_class = [np.flatnonzero(labels == k) for k in classes]
    cap = len(labels) / num_clients
    for _ in range(MAX_REDRAWS):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for idx_k in by_class:
            idx_k = rng.permutation(idx_k)
            p = rng.dirichlet(np.full(num_clients, alpha))
            if self_balancing:
                p = p * np.array([len(part) < cap for part in parts])
                if p.sum() == 0:
                    p = np.full(num_clients, 1.0 / num_clients)
                p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx_k)).astype(int)[:-1]
            for part, chunk in zip(parts, np.split(idx_k, cuts)):
                part.extend(chunk.tolist())
        if min(len(part) for part in parts) >= min_size:
            return [rng.permutation(np.asarray(part, dtype=np.int64)) for part in parts]
    raise PartitionError(
        f"no Dirichlet(alpha={alpha}) partition gave every one of {num_clients} clients "
        f">= {min_size} samples in {MAX_REDRAWS} draws: raise alpha, lower num_clients or "
        "lower partition.min_size"
    )


def _flwr_datasets_partition(
    labels: np.ndarray, method: str, num_clients: int, seed: int, shards_per_client: int
) -> list[np.ndarray]:
    from datasets import Dataset
    from flwr_datasets.partitioner import IidPartitioner, PathologicalPartitioner

    table = Dataset.from_dict({"label": labels.tolist(), "idx": np.arange(len(labels)).tolist()})
    if method == "iid":
        partitioner = IidPartitioner(num_partitions=num_clients)
        order = np.random.default_rng(seed).permutation(len(labels))
        table = table.select(order.tolist())
    else:
        n_classes = len(np.unique(labels))
        if not 1 <= shards_per_client <= n_classes:
            raise PartitionError(
                f"shards_per_client must be in 1..{n_classes} for this dataset, got {shards_per_client}"
            )
        partitioner = PathologicalPartitioner(
            num_partitions=num_clients,
            partition_by="label",
            num_classes_per_partition=shards_per_client,
            class_assignment_mode="random",
            seed=seed,
        )
    partitioner.dataset = table
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parts = [np.asarray(partitioner.load_partition(i)["idx"], dtype=np.int64) for i in range(num_clients)]
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise PartitionError(f"partitioner {method!r} left clients {empty[:10]} without samples: lower num_clients")
    return parts


def train_test_split(indices: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle one client's indices and split them; both sides keep at least one sample."""
    if not 0.0 < test_fraction < 1.0:
        raise PartitionError(f"test_fraction must be in (0, 1), got {test_fraction}")
    shuffled = np.random.default_rng(seed).permutation(indices)
    n_test = int(round(len(shuffled) * test_fraction))
    n_test = min(max(n_test, 1), len(shuffled) - 1)
    return shuffled[n_test:], shuffled[:n_test]
