"""Your data: dataset objects and image folders as the arrays every pflower data path uses.

- :func:`arrays_of`: a map-style dataset (torchvision, a Hugging Face dataset with ``image`` and
  ``label`` columns, any object with ``__len__`` and ``__getitem__`` returning ``(sample, label)``)
  or an ``(samples, labels)`` pair, as ``uint8``/``float32`` images ``[N, C, H, W]`` or ``float32``
  feature vectors ``[N, F]`` (tabular or sensor data), and ``int64`` labels. An image may be a
  tensor, an array (``HxW``, ``CxHxW`` or ``HxWxC``) or a PIL image; a vector a 1-D tensor or array.
- :func:`user_splits`: what a user's data function returns (one dataset, ``(train, test)`` or
  ``{"train": ..., "test": ...}``) as named splits (``dataset=custom``, the client builder).
- :func:`read_image_folder`: torchvision's ImageFolder layout (``root/<class>/<image>``), resized
  to the run's input shape (a SuperNode's ``data-dir`` with ``train/`` and ``test/`` folders).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

Arrays = tuple[np.ndarray, np.ndarray]


class DataHookError(ValueError):
    """User data pflower cannot read; the message names the object and what it must be."""

    user_error = True  # the user's data function to fix: one line, not a traceback


def _is_pil(image: Any) -> bool:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - torchvision depends on Pillow
        return False
    return isinstance(image, Image.Image)


def _image_array(image: Any, where: str) -> np.ndarray:
    """One sample: an image as [C, H, W] (uint8 or float32), a feature vector as [F] (float32)."""
    if hasattr(image, "detach"):  # a torch tensor: C x H x W (torch's layout), or H x W, or a vector
        image = image.detach().cpu().numpy()
        if image.ndim == 3:
            return image if image.dtype == np.uint8 else image.astype(np.float32, copy=False)
    if not _is_pil(image) and np.ndim(image) == 1:  # a feature vector: tabular or sensor data
        vector = np.asarray(image)
        if not (np.issubdtype(vector.dtype, np.floating) or np.issubdtype(vector.dtype, np.integer)):
            raise DataHookError(f"{where}: a vector of dtype {vector.dtype}; use numbers")
        return vector.astype(np.float32, copy=False)
    if _is_pil(image):
        image = np.asarray(image)
        if image.ndim == 3:
            image = image.transpose(2, 0, 1)
    image = np.asarray(image)
    if image.ndim == 2:
        image = image[None]
    elif image.ndim == 3 and image.shape[-1] in (1, 3, 4) and image.shape[0] not in (1, 3, 4):
        image = image.transpose(2, 0, 1)  # HxWxC -> CxHxW
    if image.ndim != 3:
        raise DataHookError(
            f"{where}: a sample of shape {image.shape}; a sample must be a vector [F] or an image HxW, CxHxW or HxWxC"
        )
    if image.dtype == np.uint8:
        return image
    if not np.issubdtype(image.dtype, np.floating):
        raise DataHookError(f"{where}: images of dtype {image.dtype}; use uint8 or float")
    return image.astype(np.float32, copy=False)


def arrays_of(data: Any, where: str = "the dataset") -> Arrays:
    """(images [N, C, H, W], labels int64 [N]) of a dataset object (a DataLoader: its dataset) or
    an ``(images, labels)`` pair."""
    if isinstance(data, tuple) and len(data) == 2 and all(hasattr(d, "shape") for d in data):
        return _pair_arrays(data, where)
    from torch.utils.data import DataLoader

    if isinstance(data, DataLoader):  # Flower's quickstart returns loaders: their dataset, item by item
        data = data.dataset
    if not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
        raise DataHookError(
            f"{where} is a {type(data).__name__}: pass a map-style dataset (len() and [i] -> (image, label)) "
            "or an (images, labels) pair"
        )
    if len(data) == 0:
        raise DataHookError(f"{where} is empty")
    images, labels = [], []
    for i in range(len(data)):
        image, label = _item(data[i], f"{where}[{i}]")
        images.append(image)
        labels.append(label)
    shapes = {x.shape for x in images}
    if len(shapes) != 1:
        raise DataHookError(f"{where}: samples of different shapes {sorted(shapes)[:3]}; give them one shape")
    dtype = np.uint8 if all(x.dtype == np.uint8 and x.ndim == 3 for x in images) else np.float32
    return np.stack(images).astype(dtype, copy=False), np.asarray(labels, np.int64)


def _pair_arrays(data: tuple[Any, Any], where: str) -> Arrays:
    """An ``(images, labels)`` pair of arrays or tensors, images brought to [N, C, H, W] or [N, F]."""
    images, labels = (np.asarray(d.detach().cpu() if hasattr(d, "detach") else d) for d in data)
    if images.ndim == 3:
        images = images[:, None]  # N x H x W
    elif images.ndim == 4 and images.shape[-1] in (1, 3, 4) and images.shape[1] not in (1, 3, 4):
        images = images.transpose(0, 3, 1, 2)  # N x H x W x C
    if images.ndim not in (2, 4) or labels.shape != (len(images),):
        raise DataHookError(
            f"{where}: samples {images.shape} and labels {labels.shape}; pass images [N, C, H, W] or "
            "feature vectors [N, F], and labels [N]"
        )
    if images.dtype != np.uint8 or images.ndim == 2:  # vectors are features, never 0..255 pixels
        images = images.astype(np.float32, copy=False)
    return np.ascontiguousarray(images), labels.astype(np.int64)


def _item(item: Any, where: str) -> tuple[np.ndarray, int]:
    """One dataset item, ``(image, label)`` or a Hugging Face row, as (image array, label)."""
    if isinstance(item, Mapping):  # Hugging Face rows
        keys = [k for k in ("image", "img", "pixel_values") if k in item]
        if not keys or "label" not in item:
            raise DataHookError(f"{where} has keys {sorted(item)}; pflower reads 'image' and 'label'")
        item = (item[keys[0]], item["label"])
    if not isinstance(item, (tuple, list)) or len(item) < 2:
        raise DataHookError(f"{where} is a {type(item).__name__}; items must be (image, label)")
    return _image_array(item[0], where), int(item[1])


def user_splits(result: Any, where: str) -> dict[str, Arrays]:
    """Named splits of a data function's result: ``{"all": ...}`` for one dataset, else train and test."""
    if isinstance(result, Mapping):
        unknown = sorted(set(result) - {"train", "test"})
        if unknown or "train" not in result:
            raise DataHookError(f"{where} returned splits {sorted(result)}; use 'train' and optionally 'test'")
        return {name: arrays_of(ds, f"{where}[{name!r}]") for name, ds in result.items()}
    if isinstance(result, (tuple, list)) and len(result) == 2 and not hasattr(result[0], "shape"):
        return {"train": arrays_of(result[0], f"{where} train"), "test": arrays_of(result[1], f"{where} test")}
    return {"all": arrays_of(result, where)}


def check_labels(labels: np.ndarray, num_classes: int, where: str) -> None:
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataHookError(
            f"{where}: labels must be integers in 0..{num_classes - 1}, got {labels.min()}..{labels.max()}"
        )


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def image_folder_classes(root: Path) -> list[str]:
    """The class folders of an ImageFolder directory, sorted (torchvision's class-index order)."""
    return sorted(p.name for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith("."))


def read_image_folder(root: Path, in_shape: Sequence[int], classes: Sequence[str] | None = None) -> Arrays:
    """``root/<class>/<image>`` as uint8 arrays [N, C, H, W] resized to ``in_shape`` (grey for one
    channel, RGB for three); the label of an image is its class folder's index in ``classes``
    (default: the folders found here, sorted)."""
    from PIL import Image

    root = Path(root)
    classes = list(classes) if classes is not None else image_folder_classes(root)
    channels, height, width = (int(s) for s in in_shape)
    if channels not in (1, 3):
        raise DataHookError(f"{root}: image folders give 1 (grey) or 3 (RGB) channels, the run expects {channels}")
    images, labels = [], []
    for index, name in enumerate(classes):
        folder = root / name
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            with Image.open(path) as img:
                img = img.convert("L" if channels == 1 else "RGB").resize((width, height), Image.BILINEAR)
                array = np.asarray(img, dtype=np.uint8)
            images.append(array[None] if channels == 1 else array.transpose(2, 0, 1))
            labels.append(index)
    if not images:
        raise DataHookError(f"{root}: no images (expected {root}/<class>/<image>{IMAGE_SUFFIXES[0]})")
    return np.stack(images), np.asarray(labels, np.int64)


def write_image_folder(root: Path, images: np.ndarray, labels: np.ndarray, classes: Sequence[str]) -> Path:
    """``images`` [N, C, H, W] (uint8, or float in [0, 1]) as ``root/<classes[label]>/<i>.png``: the
    layout :func:`read_image_folder` reads (a node's data for a demo or a test)."""
    from PIL import Image

    root = Path(root)
    unit = images if images.dtype == np.uint8 else np.clip(np.rint(images * 255.0), 0, 255).astype(np.uint8)
    for i, (image, label) in enumerate(zip(unit, labels)):
        folder = root / str(classes[int(label)])
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)).save(folder / f"{i:05d}.png")
    return root
