"""``dataset=hf``: any image-classification dataset that Hugging Face ``datasets`` can load.

``dataset.options.path`` is what ``datasets.load_dataset`` takes: a hub id
(``zalando-datasets/fashion_mnist``, ``uoft-cs/cifar10``), fetched when online and read from
the HF cache (``HF_HOME``; ``dataset.root`` overrides the cache directory) afterwards, or a
local directory of parquet / image-folder files. Like ``dataset=local`` the server declares
the shape its model is built for (``channels``, ``image_size``, ``num_classes``); the data
must match, or the error says which option to change.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .sources import DatasetInfo, DatasetNotFoundError, Splits, note_source, register

HOW_TO_GET = (
    "Set dataset.options.path to a Hugging Face hub id (fetched once when online, then read from "
    "the HF cache; HF_HUB_OFFLINE=1 never touches the network) or to a local directory of "
    "parquet files (train-*.parquet, test-*.parquet) or image folders."
)


def read_hf(
    root: str | None = None,
    path: str | None = None,
    config: str | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
    channels: int = 1,
    image_size: int = 28,
    num_classes: int = 10,
    **_: Any,
) -> Splits:
    """Every split of the dataset as ``[N, C, H, W]`` uint8 images and int64 labels."""
    import datasets

    if not path:
        raise ValueError(f"dataset=hf needs dataset.options.path. {HOW_TO_GET}")
    try:
        loaded = datasets.load_dataset(path, config, cache_dir=root)
    except (ConnectionError, FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as exc:
        raise DatasetNotFoundError(f"dataset.options.path={path!r} could not be loaded ({exc}). {HOW_TO_GET}") from exc
    note_source(f"hf:{path}" + (f" ({config})" if config else "") + (f" cache {root}" if root else ""))
    if not isinstance(loaded, datasets.DatasetDict):
        loaded = datasets.DatasetDict({"train": loaded})
    out: Splits = {}
    for split, ds in loaded.items():
        image_key = image_column or _column(ds, datasets.Image, "image_column", path)
        label_key = label_column or _column(ds, datasets.ClassLabel, "label_column", path, fallback="label")
        for key, option in ((image_key, "image_column"), (label_key, "label_column")):
            if key not in ds.column_names:
                raise ValueError(
                    f"{path} [{split}] has no column {key!r} (columns {ds.column_names}); set dataset.options.{option}"
                )
        images = _images(ds, image_key, channels, image_size, f"{path} [{split}]")
        labels = np.asarray(ds[label_key], dtype=np.int64)
        if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(
                f"{path} [{split}]: labels span {labels.min()}..{labels.max()}, outside 0..{num_classes - 1}; "
                "set dataset.options.num_classes"
            )
        out[split] = (images, labels)
    return out


def _column(ds: Any, feature_type: type, option: str, path: str, fallback: str | None = None) -> str:
    """The first column of the given feature type (Image, ClassLabel)."""
    for name, feature in ds.features.items():
        if isinstance(feature, feature_type):
            return name
    if fallback is not None and fallback in ds.column_names:
        return fallback
    raise ValueError(f"{path}: no {feature_type.__name__} column among {ds.column_names}; set dataset.options.{option}")


def _images(ds: Any, key: str, channels: int, size: int, where: str) -> np.ndarray:
    """Decode to one preallocated uint8 array; the mode follows ``channels`` (1: L, 3: RGB)."""
    if channels not in (1, 3):
        raise ValueError(f"dataset.options.channels must be 1 or 3 for dataset=hf, got {channels}")
    mode = "L" if channels == 1 else "RGB"
    out = np.empty((len(ds), channels, size, size), dtype=np.uint8)
    i = 0
    for batch in ds.select_columns([key]).iter(batch_size=1024):
        for image in batch[key]:
            pixels = np.asarray(image.convert(mode))
            if pixels.shape[:2] != (size, size):
                raise ValueError(
                    f"{where}: image {i} is {pixels.shape[1]}x{pixels.shape[0]}, the model is built for "
                    f"{size}x{size}; set dataset.options.image_size={pixels.shape[0]}"
                )
            out[i] = pixels[None] if channels == 1 else pixels.transpose(2, 0, 1)
            i += 1
    return out


register(DatasetInfo("hf", (1, 28, 28), 10, read_hf, how_to_get=HOW_TO_GET))
