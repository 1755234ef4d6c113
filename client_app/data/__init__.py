"""Datasets, partitioners and per-client tensors (cached once per process)."""

from .client_data import ClientData, DataSpec, load_client_data, load_public_data, partition_sizes
from .sources import DATASETS, DatasetInfo, DatasetNotFoundError, dataset_info

__all__ = [
    "DATASETS",
    "ClientData",
    "DataSpec",
    "DatasetInfo",
    "DatasetNotFoundError",
    "dataset_info",
    "load_client_data",
    "load_public_data",
    "partition_sizes",
]
