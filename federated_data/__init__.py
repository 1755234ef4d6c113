"""Datasets, partitioners and per-client tensors (cached once per process)."""

from .catalog import DATASETS, DatasetInfo, DatasetNotFoundError, dataset_info
from .client_data import (
    DataSpec,
    data_origin,
    load_client_data,
    load_public_data,
    load_transfer_data,
    partition_sizes,
)
from .tensors import ClientData

__all__ = [
    "DATASETS",
    "ClientData",
    "DataSpec",
    "DatasetInfo",
    "DatasetNotFoundError",
    "data_origin",
    "dataset_info",
    "load_client_data",
    "load_public_data",
    "load_transfer_data",
    "partition_sizes",
]
