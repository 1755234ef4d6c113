"""Each client's partition of a supported dataset, written as node-local data directories
(``scripts/export_partitions.py``): a SuperNode reading one gets the tensors the simulation gives
that client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .client_data import _pool, client_indices
from .local import LocalDataError, write_local_dir


def export_partitions(spec: Any, out: str | Path, clients: list[int] | None = None) -> list[Path]:
    """Write each client's train/test split of ``spec`` (a partitioned DataSpec) to ``out/client_<id>``.

    The images are the raw pooled images (before normalization) at exactly the indices the
    simulation gives that client, and meta.json carries the pool's mean/std, so a SuperNode
    reading the directory gets the same tensors as simulated client ``id``.
    """
    if spec.info.node_local:
        raise LocalDataError("export_partitions needs a partitioned dataset, not dataset=local")
    pool = _pool(spec)
    out = Path(out)
    paths = []
    for cid in range(spec.num_clients) if clients is None else clients:
        train_idx, test_idx = client_indices(spec, cid)
        paths.append(
            write_local_dir(
                out / f"client_{cid}",
                (pool.images[train_idx], pool.labels[train_idx]),
                (pool.images[test_idx], pool.labels[test_idx]),
                name=spec.dataset,
                num_classes=spec.info.num_classes,
                mean=pool.mean,
                std=pool.std,
                client_id=cid,
                exported_from={
                    "dataset": spec.dataset,
                    "partitioner": spec.partitioner,
                    "num_clients": spec.num_clients,
                    "alpha": spec.alpha,
                    "min_size": spec.min_size,
                    "test_fraction": spec.test_fraction,
                    "seed": spec.seed,
                },
            )
        )
    return paths
