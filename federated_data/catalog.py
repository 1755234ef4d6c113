"""Every dataset pflower can read, registered: the built-in ones of :mod:`.sources` and the
readers of the torchvision formats, MedMNIST and Hugging Face (their modules register
themselves on import; none imports a heavy library before a reader runs)."""

from __future__ import annotations

from typing import Any

from . import custom_source, hf_sources, medmnist_sources, torchvision_sources  # noqa: F401  (register their readers)
from .sources import DATASETS, DatasetInfo, DatasetNotFoundError, lookup


def dataset_info(name: str, root: str | None = None, **options: Any) -> DatasetInfo:
    """Look a dataset up by name; ``options`` (synthetic's size, classes...) may change its shape;
    ``root`` (``dataset.root``) reaches a user's data function (``custom``), which is read for it."""
    return lookup(name, root, **options)


__all__ = ["DATASETS", "DatasetInfo", "DatasetNotFoundError", "dataset_info"]
