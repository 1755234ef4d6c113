"""Per-client tensors: pool a dataset, partition it, split each client train/test, normalize.

Everything is computed once per process and cached (``functools.lru_cache`` keyed by the
frozen :class:`DataSpec`), so a simulated client costs no decoding after its first round.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from .catalog import DatasetInfo, dataset_info
from .local import load_local_data
from .partition import PartitionError, partition, train_test_split
from .partition_file import read_partition_file
from .sources import Splits, recording
from .tensors import ClientData, is_image_batch, normalize, to_unit

PUBLIC_MODES = ("none", "test", "holdout")


@dataclass(frozen=True)
class DataSpec:
    """Everything a client needs to rebuild its own split; travels in the message config."""

    dataset: str = "digits"
    root: str | None = None
    options: tuple[tuple[str, Any], ...] = ()  # reader options (synthetic size, classes...)
    partitioner: str = "dirichlet"
    num_clients: int = 20
    alpha: float = 0.3
    min_size: int = 40
    self_balancing: bool = True
    shards_per_client: int = 2
    partition_path: str | None = None  # partition=file: the JSON file of each client's indices
    test_fraction: float = 0.5
    pool_splits: bool = True  # merge the official train and test splits before partitioning
    public: str = "none"  # server-side public data: none | test (official test split) | holdout
    public_fraction: float = 0.1
    # a labelled share of the pooled data every party reads, in no client's partition (FedMD's
    # public set for transfer learning and consensus); 0: none
    transfer_fraction: float = 0.0
    subsample: float = 1.0  # keep this random fraction of the pooled data (KAPC's Scenario A: 0.1)
    seed: int = 42

    @property
    def info(self) -> DatasetInfo:
        return dataset_info(self.dataset, self.root, **dict(self.options))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["options"] = dict(self.options)
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DataSpec:
        values = dict(values)
        options = values.pop("options", {}) or {}
        if values.get("root") in ("", None):
            values["root"] = None
        known = set(cls.__dataclass_fields__)
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown data option(s) {sorted(unknown)}; valid: {sorted(known)}")
        return cls(options=tuple(sorted(dict(options).items())), **values)


@dataclass(frozen=True)
class _Pool:
    images: np.ndarray  # [N, C, H, W], uint8 or float32 in [0, 1]
    labels: np.ndarray
    public_images: np.ndarray | None
    public_labels: np.ndarray | None
    transfer_images: np.ndarray | None
    transfer_labels: np.ndarray | None
    mean: np.ndarray
    std: np.ndarray
    source: str  # the directories (or the built-in source) the reader actually read
    sha256: str  # of every split the reader returned, before pooling: the same files give the same hash


BUILT_IN = {"digits": "scikit-learn's bundled load_digits()", "synthetic": "generated in memory (dataset.options)"}


def fingerprint(splits: Splits) -> str:
    """sha256 over every split's name, arrays' dtype, shape and bytes, in split-name order: two runs
    with the same value read the same data."""
    digest = hashlib.sha256()
    for name in sorted(splits):
        for array in splits[name]:
            array = np.ascontiguousarray(array)
            digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
            digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def _validate(spec: DataSpec) -> None:
    if spec.public not in PUBLIC_MODES:
        raise ValueError(f"data.public must be one of {list(PUBLIC_MODES)}, got {spec.public!r}")
    if spec.public == "holdout" and not 0 < spec.public_fraction < 1:
        raise ValueError(f"data.public_fraction must be in (0, 1), got {spec.public_fraction}")
    if not 0 <= spec.transfer_fraction < 1:
        raise ValueError(f"dataset.transfer_fraction must be in [0, 1), got {spec.transfer_fraction}")
    if not 0 < spec.subsample <= 1:
        raise ValueError(f"dataset.subsample must be in (0, 1] (the fraction of the data kept), got {spec.subsample}")


@lru_cache(maxsize=4)
def _pool(spec_key: DataSpec) -> _Pool:
    spec = spec_key
    _validate(spec)
    info = spec.info
    with recording() as read_from:
        splits = info.reader(spec.root, **dict(spec.options))
    source = "; ".join(read_from) or BUILT_IN.get(spec.dataset, spec.dataset)
    sha256 = fingerprint(splits)
    public = public_labels = None
    if spec.public == "test":
        if "test" not in splits:
            raise ValueError(
                f"dataset {spec.dataset!r} has no official test split for data.public=test; use data.public=holdout"
            )
        public, public_labels = splits.pop("test")
        public_labels = np.asarray(public_labels).astype(np.int64)
    if spec.pool_splits or "train" not in splits:
        images = np.concatenate([s[0] for s in splits.values()])
        labels = np.concatenate([s[1] for s in splits.values()])
    else:
        images, labels = splits["train"]
    labels = labels.astype(np.int64)
    if spec.subsample < 1:  # a fixed random subset, drawn before the public holdout and the partition
        keep = np.sort(
            np.random.default_rng(spec.seed + 104_729).permutation(len(labels))[
                : max(1, round(len(labels) * spec.subsample))
            ]
        )
        images, labels = images[keep], labels[keep]
    if spec.public == "holdout":
        order = np.random.default_rng(spec.seed + 7919).permutation(len(labels))
        n_pub = int(len(labels) * spec.public_fraction)
        public, public_labels = images[order[:n_pub]], labels[order[:n_pub]]
        images, labels = images[order[n_pub:]], labels[order[n_pub:]]
    if info.mean is not None and info.std is not None:
        mean, std = np.asarray(info.mean, np.float32), np.asarray(info.std, np.float32)
    elif not is_image_batch(images):  # feature vectors: no pixel statistics (normalize leaves them as they are)
        mean, std = np.zeros(0, np.float32), np.ones(0, np.float32)
    else:
        as_float = to_unit(images)
        mean = as_float.mean(axis=(0, 2, 3)).astype(np.float32)
        std = (as_float.std(axis=(0, 2, 3)) + 1e-8).astype(np.float32)
    transfer = transfer_labels = None
    if spec.transfer_fraction > 0:  # after the statistics: a run with it normalizes as one without
        order = np.random.default_rng(spec.seed + 15_485_863).permutation(len(labels))
        n_transfer = int(len(labels) * spec.transfer_fraction)
        transfer, transfer_labels = images[order[:n_transfer]], labels[order[:n_transfer]]
        images, labels = images[np.sort(order[n_transfer:])], labels[np.sort(order[n_transfer:])]
    return _Pool(images, labels, public, public_labels, transfer, transfer_labels, mean, std, source, sha256)


def _given(spec: DataSpec) -> tuple[tuple[np.ndarray, np.ndarray | None], ...]:
    """partition=file: each client's (train, test) of the file, test None where it gives one list."""
    return read_partition_file(spec.partition_path or "", spec.num_clients, len(_pool(spec).labels))


@lru_cache(maxsize=4)
def _partition(spec: DataSpec) -> tuple[np.ndarray, ...]:
    if spec.partitioner == "file":
        return tuple(train if test is None else np.concatenate([train, test]) for train, test in _given(spec))
    return tuple(
        partition(
            _pool(spec).labels,
            spec.partitioner,
            spec.num_clients,
            spec.seed,
            alpha=spec.alpha,
            min_size=spec.min_size,
            self_balancing=spec.self_balancing,
            shards_per_client=spec.shards_per_client,
        )
    )


def _normalize(images: np.ndarray, pool: _Pool) -> torch.Tensor:
    return normalize(images, pool.mean, pool.std)


def client_indices(spec: DataSpec, client_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) pooled indices of one client."""
    if not 0 <= client_id < spec.num_clients:
        raise ValueError(
            f"client id {client_id} is outside 0..{spec.num_clients - 1}: the federation has "
            f"more nodes than num_clients={spec.num_clients} (set num_clients to the number of "
            'SuperNodes, e.g. --federation-config "num-supernodes=N" with num_clients=N)'
        )
    if spec.partitioner == "file":
        part, test = _given(spec)[client_id]
        if test is not None:  # the file's own train/test split
            return part, test
    else:
        part = _partition(spec)[client_id]
    return train_test_split(part, spec.test_fraction, spec.seed * 100_003 + client_id)


@lru_cache(maxsize=256)
def load_client_data(spec: DataSpec, client_id: int) -> ClientData:
    """Normalized train/test tensors of one client's partition (cached per process).

    For a node-local source (``dataset=local``) the tensors come from the node's own
    directory (``spec.root``, the node config's ``data-dir``) instead of a partition.
    """
    if spec.info.node_local:
        return load_local_data(spec, client_id)
    pool = _pool(spec)
    train_idx, test_idx = client_indices(spec, client_id)
    return ClientData(
        client_id=client_id,
        x_train=_normalize(pool.images[train_idx], pool),
        y_train=torch.from_numpy(pool.labels[train_idx]),
        x_test=_normalize(pool.images[test_idx], pool),
        y_test=torch.from_numpy(pool.labels[test_idx]),
        num_classes=spec.info.num_classes,
    )


def load_public_data(spec: DataSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The server's public split (dataset.public=test|holdout): normalized images and their labels.

    FedTSDP uses the images only (unlabelled public data); Felo/Velo evaluate group models on
    the labelled global test set (``dataset.public=test``).
    """
    pool = _pool(spec)
    if pool.public_images is None:
        raise ValueError("this data spec has no public split: set dataset.public=test or holdout")
    return _normalize(pool.public_images, pool), torch.from_numpy(pool.public_labels)


def load_transfer_data(spec: DataSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The labelled transfer split (``dataset.transfer_fraction``): normalized images and labels,
    the same on every party that reads the dataset (FedMD's public set)."""
    pool = _pool(spec)
    if pool.transfer_images is None:
        raise ValueError(
            "this data spec has no transfer split: set dataset.transfer_fraction (e.g. 0.1, the share of the pooled "
            "data every party holds labelled)"
        )
    return _normalize(pool.transfer_images, pool), torch.from_numpy(pool.transfer_labels)


def data_origin(spec: DataSpec) -> dict[str, str]:
    """Where the run's pooled data came from, for its record: ``data_dir`` (what the reader read:
    the directory that held the files, not the root it was given) and ``data_sha256`` (of the
    arrays read, :func:`fingerprint`). Empty for node-held data (each node reads its own)."""
    if spec.info.node_local:
        return {}
    pool = _pool(spec)
    return {"data_dir": pool.source, "data_sha256": pool.sha256}


def partition_sizes(spec: DataSpec) -> list[int]:
    """Samples per client (train+test); builds the partition, so it also validates the spec.

    A node-local source has no partition on the server: nothing to check there (each
    SuperNode validates its own directory when it is first asked), so the list is empty.
    """
    if spec.info.node_local:
        return []
    return [len(p) for p in _partition(spec)]


__all__ = [
    "ClientData",
    "DataSpec",
    "PartitionError",
    "client_indices",
    "data_origin",
    "fingerprint",
    "load_client_data",
    "load_public_data",
    "load_transfer_data",
    "partition_sizes",
]
