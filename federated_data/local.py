"""Node-local data: a SuperNode reads its own directory instead of a partition of a shared dataset.

In a real deployment every device holds its own data. The server's config says
``dataset=local`` (with the input shape and class count every node must match, see
``conf/dataset/local.yaml``) and each SuperNode names its directory in its node config
(``--node-config "client-id=0 data-dir='/data/client_0'"``). The directory holds:

    train.npz   images [N, C, H, W] (uint8, or float in [0, 1]) and labels [N] (ints)
    test.npz    the same for the node's test split
    meta.json   {"name": ..., "in_shape": [C, H, W], "num_classes": K,
                 optional "mean"/"std" (per channel, of the [0, 1] images) and "client_id"}

Or, in torchvision's ImageFolder layout, ``train/<class>/<image>`` and ``test/<class>/<image>``
(meta.json optional; its ``classes`` fixes the label order): images are resized to the
server's input shape, labels are the sorted class folders' indices
(:func:`.datasets.read_image_folder`).

Images are normalized with meta.json's mean/std when given (the exporter writes the pooled
dataset's, so tensors equal the simulation's), else with the node's own training split's.
:func:`federated_data.export.export_partitions` writes each client's partition of a supported dataset in this
format (``scripts/export_partitions.py``), for demos and tests.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.common import log

from .datasets import DataHookError, image_folder_classes, read_image_folder
from .tensors import ClientData, normalize, to_unit

LOCAL = "local"
DATA_DIR_KEY = "data-dir"  # the node config key naming a SuperNode's data directory
TRAIN, TEST, META = "train.npz", "test.npz", "meta.json"


class LocalDataError(ValueError):
    """A node's data directory that cannot be used; the message names the file and the fix."""


def with_node_data_dir(data_spec: Mapping[str, Any], node_config: Mapping[str, Any]) -> dict[str, Any]:
    """The data spec a node uses: for ``dataset=local`` the root is the node's ``data-dir``."""
    spec = dict(data_spec)
    if spec.get("dataset") != LOCAL:
        return spec
    data_dir = node_config.get(DATA_DIR_KEY)
    if not data_dir:
        raise LocalDataError(
            "the server asked for node-local data (dataset=local) but this SuperNode has no data "
            "directory: start it with --node-config \"client-id=<N> data-dir='/path/to/its/data'\""
        )
    spec["root"] = str(Path(str(data_dir)).expanduser())
    return spec


# ----------------------------------------------------------------------------- writing


def write_local_dir(
    path: str | Path,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    *,
    name: str,
    num_classes: int,
    mean: np.ndarray | None = None,
    std: np.ndarray | None = None,
    **meta: Any,
) -> Path:
    """Write one node's directory (train.npz, test.npz, meta.json); returns its path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    images = train[0]
    info: dict[str, Any] = {
        "name": name,
        "in_shape": [int(s) for s in images.shape[1:]],
        "num_classes": int(num_classes),
        "num_train": int(len(train[1])),
        "num_test": int(len(test[1])),
        **meta,
    }
    if mean is not None and std is not None:
        info["mean"] = [float(v) for v in np.asarray(mean, np.float32)]
        info["std"] = [float(v) for v in np.asarray(std, np.float32)]
    for fname, (x, y) in ((TRAIN, train), (TEST, test)):
        _atomic_npz(path / fname, images=np.ascontiguousarray(x), labels=np.asarray(y, np.int64))
    (path / META).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return path


def _atomic_npz(path: Path, **arrays: np.ndarray) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    os.close(fd)
    np.savez(tmp, **arrays)
    os.chmod(tmp, 0o644)  # mkstemp makes it 0600: a container user must be able to read it
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- reading


def is_image_folder(root: str | Path) -> bool:
    """A node directory in the ImageFolder layout (train/ and test/ folders of class folders)."""
    root = Path(root)
    return not (root / TRAIN).exists() and (root / "train").is_dir() and (root / "test").is_dir()


def read_meta(root: str | Path) -> dict[str, Any]:
    root = Path(root)
    if is_image_folder(root):
        return json.loads((root / META).read_text()) if (root / META).exists() else {}
    missing = [f for f in (TRAIN, TEST, META) if not (root / f).exists()]
    if missing:
        raise LocalDataError(
            f"node data directory {root} lacks {missing}: it must hold {TRAIN}, {TEST} and {META} "
            "(scripts/export_partitions.py writes them from a supported dataset)"
        )
    try:
        return json.loads((root / META).read_text())
    except json.JSONDecodeError as exc:
        raise LocalDataError(f"{root / META} is not valid JSON: {exc}") from exc


def _read_split(path: Path, in_shape: tuple[int, ...], num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            images, labels = z["images"], z["labels"]
    except (KeyError, ValueError, OSError) as exc:
        raise LocalDataError(f"{path}: cannot read arrays 'images' and 'labels' ({exc})") from exc
    if images.ndim != 4 or tuple(images.shape[1:]) != tuple(in_shape):
        raise LocalDataError(f"{path}: images have shape {images.shape}, expected [N, {', '.join(map(str, in_shape))}]")
    if labels.shape != (len(images),):
        raise LocalDataError(f"{path}: {len(labels)} labels for {len(images)} images (labels must be [N])")
    if len(labels) == 0:
        raise LocalDataError(f"{path}: no samples")
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 or labels.max() >= num_classes:
        raise LocalDataError(f"{path}: labels must be integers in 0..{num_classes - 1}")
    if images.dtype != np.uint8:
        if not np.issubdtype(images.dtype, np.floating):
            raise LocalDataError(f"{path}: images must be uint8 or float in [0, 1], got {images.dtype}")
        if not np.all(np.isfinite(images)) or images.min() < 0 or images.max() > 1:
            raise LocalDataError(f"{path}: float images must be finite and in [0, 1]")
    return images, labels.astype(np.int64)


def load_local_data(spec: Any, client_id: int) -> Any:
    """One node's normalized tensors from its directory (``spec.root``), checked against the spec."""

    if spec.root is None:
        raise LocalDataError("dataset=local needs the node's data directory (node config data-dir)")
    root = Path(spec.root)
    meta = read_meta(root)
    info = spec.info
    expected = dict(dict(spec.options))
    want_name = expected.get("meta_name")
    if want_name and meta.get("name") != want_name:
        raise LocalDataError(f"{root / META}: dataset {meta.get('name')!r}, but the server expects {want_name!r}")
    if "client_id" in meta and int(meta["client_id"]) != client_id:
        raise LocalDataError(
            f"{root} holds the data of client {meta['client_id']} but this SuperNode is client {client_id}: "
            "check its client-id and data-dir"
        )
    if is_image_folder(root):
        return _image_folder_data(root, meta, info, client_id)
    if [int(s) for s in meta.get("in_shape", [])] != list(info.in_shape):
        raise LocalDataError(
            f"{root / META}: in_shape {meta.get('in_shape')} but the server's model expects {list(info.in_shape)} "
            "(set dataset.options.channels / image_size on the server to match the nodes)"
        )
    if int(meta.get("num_classes", -1)) != info.num_classes:
        raise LocalDataError(
            f"{root / META}: num_classes {meta.get('num_classes')} but the server expects {info.num_classes} "
            "(set dataset.options.num_classes)"
        )
    x_train, y_train = _read_split(root / TRAIN, info.in_shape, info.num_classes)
    x_test, y_test = _read_split(root / TEST, info.in_shape, info.num_classes)
    return _node_data(client_id, root, meta, info, (x_train, y_train), (x_test, y_test), meta)


def _node_data(
    client_id: int,
    root: Path,
    meta: dict[str, Any],
    info: Any,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    record: dict[str, Any],
) -> ClientData:
    """A node's arrays normalized with meta.json's mean/std when given (the exporter writes the
    pooled dataset's), else with its own training split's; ``record``: what the run records of it."""
    (x_train, y_train), (x_test, y_test) = train, test
    if "mean" in meta and "std" in meta:
        mean, std = np.asarray(meta["mean"], np.float32), np.asarray(meta["std"], np.float32)
        if mean.shape != (info.in_shape[0],) or std.shape != mean.shape or not np.all(std > 0):
            raise LocalDataError(f"{root / META}: mean/std must hold one value per channel (std > 0)")
    else:
        unit = to_unit(x_train)
        mean = unit.mean(axis=(0, 2, 3)).astype(np.float32)
        std = (unit.std(axis=(0, 2, 3)) + 1e-8).astype(np.float32)
    return ClientData(
        client_id=client_id,
        x_train=normalize(x_train, mean, std),
        y_train=torch.from_numpy(y_train),
        x_test=normalize(x_test, mean, std),
        y_test=torch.from_numpy(y_test),
        num_classes=info.num_classes,
        extra={"data_dir": str(root), "meta": record},
    )


def _image_folder_data(root: Path, meta: dict[str, Any], info: Any, client_id: int) -> ClientData:
    """A node's train/ and test/ image folders, at the server's input shape and class count.
    meta.json (optional) may fix the class order (``classes``: folder names, label = index; else
    the sorted folders of train/, torchvision's order) and the normalization (``mean``/``std``)."""
    classes = [str(c) for c in meta.get("classes") or image_folder_classes(root / "train")]
    for split in ("train", "test"):
        stray = sorted(set(image_folder_classes(root / split)) - set(classes))
        if stray:
            raise LocalDataError(
                f"{root / split} has class folders {stray} that "
                f"{'meta.json classes' if meta.get('classes') else root / 'train'} lacks"
            )
    if len(classes) > info.num_classes:
        raise LocalDataError(
            f"{root} has {len(classes)} classes but the server expects {info.num_classes} "
            "(set dataset.options.num_classes on the server)"
        )
    try:
        x_train, y_train = read_image_folder(root / "train", info.in_shape, classes)
        x_test, y_test = read_image_folder(root / "test", info.in_shape, classes)
    except DataHookError as err:
        raise LocalDataError(str(err)) from err
    log(
        INFO,
        "client %d: %d training and %d test images from the image folders under %s",
        client_id,
        len(y_train),
        len(y_test),
        root,
    )
    record = {**meta, "format": "imagefolder", "classes": classes}
    return _node_data(client_id, root, meta, info, (x_train, y_train), (x_test, y_test), record)


__all__ = [
    "DATA_DIR_KEY",
    "LOCAL",
    "LocalDataError",
    "load_local_data",
    "read_meta",
    "with_node_data_dir",
    "write_local_dir",
]
