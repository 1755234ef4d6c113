"""``partition=file``: each client's samples read from a JSON file instead of drawn by a partitioner.

For comparing with another code on the very same clients (e.g. a partition exported from the
authors' code of a paper, ``benchmarks/authors/flbench_partition.py``) or for a split a user has
already made. The file holds indices into the pooled dataset (the official train split, then
the test split, as pflower pools them; ``dataset.pool_splits=false``: the train split only)::

    {"clients": [{"train": [12, 7, ...], "test": [3, ...]}, ...]}

A client given as a plain list (``[12, 7, 3, ...]``) is split train/test by ``test_fraction``
as with the drawn partitions. Every client process reads the file: in a deployment the path must
exist on every node (or use ``dataset=local``, each node's own directory).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from .partition import PartitionError

ClientSplit = tuple[np.ndarray, np.ndarray | None]  # (train or all, test or None: split by test_fraction)


def _indices(values: object, where: str, pool_size: int) -> np.ndarray:
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise PartitionError(f"{where} must be a list of integer sample indices")
    out = np.asarray(values, dtype=np.int64)
    if len(out) and (out.min() < 0 or out.max() >= pool_size):
        raise PartitionError(
            f"{where} holds index {int(out.min() if out.min() < 0 else out.max())} outside the pooled dataset's "
            f"0..{pool_size - 1}: was the file made for another dataset, or with dataset.pool_splits set otherwise?"
        )
    return out


@lru_cache(maxsize=4)
def read_partition_file(path: str, num_clients: int, pool_size: int) -> tuple[ClientSplit, ...]:
    """The clients of ``path``, checked against the run (``num_clients``) and the pooled data."""
    if not path:
        raise PartitionError("partition=file needs partition.path: a JSON file {'clients': [{'train': [...], ...}]}")
    file = Path(path).expanduser()
    try:
        data = json.loads(file.read_text())
    except OSError as exc:
        raise PartitionError(f"partition.path={path!r} cannot be read ({exc.strerror or exc}): give an existing file")
    except json.JSONDecodeError as exc:
        raise PartitionError(f"partition.path={path!r} is not JSON ({exc}); see docs/configuration.md for its format")
    clients = data.get("clients") if isinstance(data, dict) else None
    unknown = sorted(set(data) - {"clients", "source"}) if isinstance(data, dict) else []
    if unknown:
        raise PartitionError(f"partition.path={path!r} has unknown keys {unknown}; keys: clients, source (a note)")
    if not isinstance(clients, list) or not clients:
        raise PartitionError(f"partition.path={path!r} must hold {{'clients': [...]}}, one entry per client")
    if len(clients) != num_clients:
        raise PartitionError(
            f"partition.path={path!r} holds {len(clients)} clients but num_clients={num_clients}: "
            f"set num_clients={len(clients)}"
        )
    out: list[ClientSplit] = []
    for i, entry in enumerate(clients):
        where = f"partition.path={path!r} client {i}"
        if isinstance(entry, dict):
            unknown = sorted(set(entry) - {"train", "test"})
            if unknown or "train" not in entry or "test" not in entry:
                raise PartitionError(f"{where} must have exactly 'train' and 'test' lists, got keys {sorted(entry)}")
            split = (
                _indices(entry["train"], f"{where} train", pool_size),
                _indices(entry["test"], f"{where} test", pool_size),
            )
            if not len(split[0]) or not len(split[1]):
                raise PartitionError(f"{where} has an empty train or test list: every client needs both")
        else:
            split = (_indices(entry, where, pool_size), None)
            if len(split[0]) < 2:
                raise PartitionError(f"{where} holds {len(split[0])} samples; a client needs 2 (one train, one test)")
        out.append(split)
    return tuple(out)
