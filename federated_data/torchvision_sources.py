"""Readers for torchvision-layout roots (MNIST, EMNIST, CIFAR, SVHN, CINIC-10, Tiny-ImageNet).

The files are read directly (IDX, pickle, .mat, PNG/JPEG) rather than through
``torchvision.datasets`` so that nothing ever tries to download and the decoded images stay
``uint8`` in one preallocated array: EMNIST byclass alone pools ~814k images (~640 MB as uint8,
four times that as float32). Each dataset registers itself at import time.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .idx import read_idx
from .sources import DATASETS, DatasetInfo, Splits, data_roots, find_files, pick, register


def _locate(name: str, root: str | None, required: Sequence[Sequence[str]], subdirs: Sequence[str]) -> Path:
    """The directory holding ``name``'s files, searched under every configured root."""
    info = DATASETS[name]
    return find_files(
        name,
        data_roots(root, info.default_roots),
        required,
        subdirs=subdirs,
        how_to_get=info.how_to_get,
        user_root=root,
    )


# ----------------------------------------------------------------------------- IDX (MNIST, EMNIST)


def _gz(name: str) -> list[str]:
    """A file name and its gzip-compressed variant (both layouts are common)."""
    return [name, name + ".gz"]


def _transpose_in_place(images: np.ndarray, chunk: int = 65536) -> None:
    """Swap H and W of square ``[N, H, H]`` images by chunks: EMNIST never holds two full copies."""
    for start in range(0, len(images), chunk):
        block = images[start : start + chunk]
        block[...] = block.transpose(0, 2, 1).copy()


def _read_idx_splits(
    name: str,
    root: str | None,
    files: Mapping[str, tuple[str, str]],
    subdirs: Sequence[str],
    transpose: bool = False,
) -> Splits:
    """``{split: (images [N,1,H,W] uint8, labels)}`` from (images, labels) IDX file pairs."""
    required = [_gz(f) for pair in files.values() for f in pair]
    base = _locate(name, root, required, subdirs)
    out: Splits = {}
    for split, (img_name, lab_name) in files.items():
        images = read_idx(pick(base, _gz(img_name)))  # a writable uint8 copy
        labels = read_idx(pick(base, _gz(lab_name))).astype(np.int64)
        if len(images) != len(labels):
            raise ValueError(f"{base}: {len(images)} {split} images but {len(labels)} labels")
        if transpose:
            _transpose_in_place(images)
        out[split] = (images[:, None, :, :], labels)
    return out


_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_EMNIST_FILES = {
    split: tuple(f"emnist-byclass-{split}-{kind}-ubyte" for kind in ("images-idx3", "labels-idx1"))
    for split in ("train", "test")
}


def read_mnist(root: str | None = None) -> Splits:
    """MNIST from torchvision's ``MNIST/raw`` IDX files (gzip or not)."""
    return _read_idx_splits("mnist", root, _MNIST_FILES, ("MNIST/raw", "mnist", "MNIST", ""))


def read_emnist(root: str | None = None) -> Splits:
    """EMNIST byclass (62 classes); the IDX images are stored transposed, so flip them upright."""
    subdirs = ("EMNIST/raw", "emnist/raw", "emnist", "gzip", "")
    return _read_idx_splits("emnist", root, _EMNIST_FILES, subdirs, transpose=True)


# ----------------------------------------------------------------------------- CIFAR pickles


def _load_pickle(path: Path) -> dict[str, object]:
    """One CIFAR batch; latin1 decodes the Python 2 numpy payload, keys come back as str."""
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="latin1")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}


def _read_cifar(
    name: str,
    root: str | None,
    files: Mapping[str, Sequence[str]],
    label_key: str,
    subdirs: Sequence[str],
) -> Splits:
    """``{split: (images [N,3,32,32] uint8, labels)}`` from CIFAR's pickled row batches."""
    base = _locate(name, root, [[f] for names in files.values() for f in names], subdirs)
    out: Splits = {}
    for split, names in files.items():
        batches = [_load_pickle(base / n) for n in names]
        images = np.concatenate([np.asarray(b["data"], dtype=np.uint8) for b in batches])
        labels = np.concatenate([np.asarray(b[label_key], dtype=np.int64) for b in batches])
        out[split] = (images.reshape(-1, 3, 32, 32), labels)
    return out


def read_cifar10(root: str | None = None) -> Splits:
    """CIFAR-10 from ``cifar-10-batches-py`` (data_batch_1..5, test_batch)."""
    files = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
    return _read_cifar("cifar10", root, files, "labels", ("cifar-10-batches-py", "cifar10", ""))


def read_cifar100(root: str | None = None) -> Splits:
    """CIFAR-100 (fine labels) from ``cifar-100-python`` (train, test)."""
    files = {"train": ["train"], "test": ["test"]}
    return _read_cifar("cifar100", root, files, "fine_labels", ("cifar-100-python", "cifar100", ""))


# ----------------------------------------------------------------------------- SVHN .mat


def read_svhn(root: str | None = None) -> Splits:
    """SVHN cropped digits from ``{train,test}_32x32.mat``; label 10 stands for digit 0."""
    from scipy.io import loadmat

    files = {"train": "train_32x32.mat", "test": "test_32x32.mat"}
    base = _locate("svhn", root, [[f] for f in files.values()], ("svhn", "SVHN", ""))
    out: Splits = {}
    for split, fname in files.items():
        mat = loadmat(base / fname)
        images = np.ascontiguousarray(np.asarray(mat["X"], dtype=np.uint8).transpose(3, 2, 0, 1))
        labels = np.asarray(mat["y"], dtype=np.int64).reshape(-1)
        labels[labels == 10] = 0
        out[split] = (images, labels)
    return out


# ----------------------------------------------------------------------------- image folders


def _decode_into(out: np.ndarray, index: int, path: Path) -> None:
    """Decode one image file as RGB into ``out[index]`` (``[3, H, W]``), checking its size."""
    from PIL import Image

    with Image.open(path) as img:
        rgb = np.asarray(img.convert("RGB"))  # grayscale/CMYK JPEGs occur in Tiny-ImageNet
    if rgb.shape[:2] != out.shape[2:]:
        h, w = out.shape[2:]
        raise ValueError(f"{path} is {rgb.shape[1]}x{rgb.shape[0]} pixels, expected {w}x{h}")
    out[index] = rgb.transpose(2, 0, 1)


def _decode_images(paths: Sequence[Path], size: int) -> np.ndarray:
    """All ``paths`` decoded into one preallocated ``[N, 3, size, size]`` uint8 array (threaded)."""
    out = np.empty((len(paths), 3, size, size), dtype=np.uint8)
    if len(paths) > 0:
        workers = min(16, os.cpu_count() or 1, len(paths))
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(_decode_into, [out] * len(paths), range(len(paths)), paths))
    return out


def _image_split(items: Sequence[tuple[Path, int]], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(images, labels) from (file, class index) pairs."""
    paths = [p for p, _ in items]
    labels = np.fromiter((c for _, c in items), dtype=np.int64, count=len(items))
    return _decode_images(paths, size), labels


def _class_index(classes: Sequence[str], name: str, num_classes: int) -> dict[str, int]:
    """Class name -> index in sorted order (ImageFolder's convention)."""
    ordered = sorted(set(classes))
    if not ordered or len(ordered) > num_classes:
        raise ValueError(f"{name}: found {len(ordered)} classes, expected 1..{num_classes}")
    return {c: i for i, c in enumerate(ordered)}


def _subdirs(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.is_dir())


def _images_in(folder: Path, suffixes: Sequence[str]) -> list[Path]:
    """Image files of one folder, sorted so that the order is the same on every machine."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in suffixes)


def read_cinic10(root: str | None = None) -> Splits:
    """CINIC-10 train and test ImageFolders (the valid split is left out)."""
    base = _locate("cinic10", root, [["train"], ["test"]], ("cinic10", "CINIC-10", "cinic-10", ""))
    index = _class_index(_subdirs(base / "train"), "cinic10", 10)
    out: Splits = {}
    for split in ("train", "test"):
        folder = base / split
        items = [(p, index[c]) for c in _subdirs(folder) for p in _images_in(folder / c, (".png",))]
        out[split] = _image_split(items, 32)
    return out


def read_tinyimagenet(root: str | None = None) -> Splits:
    """Tiny-ImageNet-200: train folders and the labelled val set (served as ``test``)."""
    base = _locate("tinyimagenet", root, [["train"], ["val/val_annotations.txt"]], ("tiny-imagenet-200", ""))
    wnids_file = base / "wnids.txt"
    wnids = wnids_file.read_text().split() if wnids_file.exists() else _subdirs(base / "train")
    index = _class_index(wnids, "tinyimagenet", 200)
    suffixes = (".jpeg", ".jpg")
    train = [
        (p, index[w]) for w in _subdirs(base / "train") for p in _images_in(base / "train" / w / "images", suffixes)
    ]
    val = []
    for line in (base / "val" / "val_annotations.txt").read_text().splitlines():
        fields = line.split("\t")
        if len(fields) >= 2:
            val.append((base / "val" / "images" / fields[0], index[fields[1]]))
    return {"train": _image_split(train, 64), "test": _image_split(sorted(val), 64)}


# ----------------------------------------------------------------------------- registry

_TV = "a root filled by `torchvision.datasets.{}(root, download=True)` works as-is."

for _info in (
    DatasetInfo(
        "mnist",
        (1, 28, 28),
        10,
        read_mnist,
        mean=(0.1307,),
        std=(0.3081,),
        how_to_get="Put the four MNIST IDX files ({train,t10k}-images-idx3-ubyte.gz and "
        "{train,t10k}-labels-idx1-ubyte.gz, gzipped or not) in ROOT/MNIST/raw/; " + _TV.format("MNIST"),
    ),
    DatasetInfo(
        "emnist",
        (1, 28, 28),
        62,
        read_emnist,
        mean=(0.1751,),
        std=(0.3332,),
        how_to_get="Unpack NIST's EMNIST archive gzip.zip and put emnist-byclass-{train,test}-"
        "{images-idx3,labels-idx1}-ubyte[.gz] in ROOT/EMNIST/raw/; " + _TV.format("EMNIST"),
    ),
    DatasetInfo(
        "cifar10",
        (3, 32, 32),
        10,
        read_cifar10,
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
        how_to_get="Extract cifar-10-python.tar.gz (CIFAR-10 python version) into ROOT, giving "
        "ROOT/cifar-10-batches-py/{data_batch_1..5,test_batch}; " + _TV.format("CIFAR10"),
    ),
    DatasetInfo(
        "cifar100",
        (3, 32, 32),
        100,
        read_cifar100,
        mean=(0.5071, 0.4865, 0.4409),
        std=(0.2673, 0.2564, 0.2762),
        how_to_get="Extract cifar-100-python.tar.gz (CIFAR-100 python version) into ROOT, giving "
        "ROOT/cifar-100-python/{train,test}; " + _TV.format("CIFAR100"),
    ),
    DatasetInfo(
        "svhn",
        (3, 32, 32),
        10,
        read_svhn,
        mean=(0.4377, 0.4438, 0.4728),
        std=(0.1980, 0.2010, 0.1970),
        how_to_get="Download SVHN format 2 (cropped digits) train_32x32.mat and test_32x32.mat to "
        "ROOT/svhn/ (or ROOT itself); " + _TV.format("SVHN"),
    ),
    DatasetInfo(
        "cinic10",
        (3, 32, 32),
        10,
        read_cinic10,
        mean=(0.4789, 0.4723, 0.4305),
        std=(0.2421, 0.2383, 0.2587),
        how_to_get="Extract CINIC-10.tar.gz (Edinburgh DataShare) into ROOT/cinic10/, "
        "giving ROOT/cinic10/{train,test}/<class>/*.png (valid/ is not used).",
    ),
    DatasetInfo(
        "tinyimagenet",
        (3, 64, 64),
        200,
        read_tinyimagenet,
        mean=(0.4802, 0.4481, 0.3975),
        std=(0.2770, 0.2691, 0.2821),
        how_to_get="Unzip tiny-imagenet-200.zip (Stanford CS231n) into ROOT, giving "
        "ROOT/tiny-imagenet-200/{wnids.txt,train/<wnid>/images/*.JPEG,val/images/*.JPEG,"
        "val/val_annotations.txt}.",
    ),
):
    register(_info)
del _info
