"""Readers for MedMNIST v2 ``.npz`` files (OrganAMNIST, OrganCMNIST: FedCMD's and FedCPMD's MedMNIST-A/-C).

A file as Zenodo and the ``medmnist`` package ship it (``~/.medmnist/organamnist.npz``) holds
``{train,val,test}_images`` ``[N, 28, 28]`` uint8 and ``{train,val,test}_labels`` ``[N, 1]``.
The papers pool every split (OrganAMNIST 58,850 images, OrganCMNIST 23,660); ``val`` joins
``train`` here so that ``data.public=test`` still means the official test split.
"""

from __future__ import annotations

import zipfile

import numpy as np

from .sources import DATASETS, DatasetInfo, DatasetNotFoundError, Splits, data_roots, find_files, register

_KEYS = [f"{split}_{kind}" for split in ("train", "val", "test") for kind in ("images", "labels")]


def read_medmnist_npz(name: str, root: str | None = None) -> Splits:
    """``{"train": train+val, "test": test}`` as ``[N, 1, 28, 28]`` uint8 and int64 labels."""
    info = DATASETS[name]
    file = f"{name}.npz"
    base = find_files(
        name,
        data_roots(root, info.default_roots),
        [[file]],
        ("medmnist", "MedMNIST", ""),
        info.how_to_get,
        user_root=root,
    )
    path = base / file
    try:
        with np.load(path) as npz:
            missing = [k for k in _KEYS if k not in npz.files]
            if missing:
                raise ValueError(f"{path}: not a MedMNIST file, it lacks {missing}. {info.how_to_get}")
            arrays = {k: npz[k] for k in _KEYS}
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise DatasetNotFoundError(f"{path} cannot be read ({exc}); download it again. {info.how_to_get}") from exc
    out: Splits = {}
    for split, parts in (("train", ("train", "val")), ("test", ("test",))):
        images = np.concatenate([arrays[f"{p}_images"] for p in parts])
        labels = np.concatenate([arrays[f"{p}_labels"].reshape(-1) for p in parts]).astype(np.int64)
        if images.ndim != 3 or images.shape[1:] != info.in_shape[1:] or images.dtype != np.uint8:
            raise ValueError(
                f"{path}: {split} images are {images.dtype} {list(images.shape)}, expected uint8 "
                f"[N, {info.in_shape[1]}, {info.in_shape[2]}] (the 28x28 file, not e.g. {name}_64.npz)"
            )
        if len(labels) != len(images) or labels.min(initial=0) < 0 or labels.max(initial=0) >= info.num_classes:
            raise ValueError(f"{path}: {split} labels must be {len(images)} values in 0..{info.num_classes - 1}")
        out[split] = (images[:, None], labels)
    return out


def _how_to_get(name: str) -> str:
    return (
        f"Put {name}.npz (MedMNIST v2, the 28x28 file, from the Zenodo record linked at "
        f"medmnist.com) in ROOT or ROOT/medmnist/; the medmnist package's ~/.medmnist/ is searched too."
    )


for _name in ("organamnist", "organcmnist"):
    register(
        DatasetInfo(
            _name,
            (1, 28, 28),
            11,
            lambda root=None, _n=_name: read_medmnist_npz(_n, root),
            default_roots=("~/.medmnist",),
            how_to_get=_how_to_get(_name),
        )
    )
del _name
