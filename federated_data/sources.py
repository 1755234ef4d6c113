"""Where images come from: a registry of dataset readers that work offline.

Every reader returns named splits of ``(images, labels)``: images ``uint8`` or ``float32``
in [0, 1] with shape ``[N, C, H, W]``, labels ``int64`` ``[N]``. Readers never download;
a dataset that cannot be found raises :class:`DatasetNotFoundError` saying where it
looked and how to get the files.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .idx import read_idx

Splits = dict[str, tuple[np.ndarray, np.ndarray]]
Reader = Callable[..., Splits]


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are not on this machine."""


@dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about a dataset, without loading it."""

    name: str
    in_shape: tuple[int, ...]  # (C, H, W) for images, (F,) for feature vectors
    num_classes: int
    reader: Reader
    mean: tuple[float, ...] | None = None  # None: computed from the data
    std: tuple[float, ...] | None = None
    default_roots: tuple[str, ...] = ()
    how_to_get: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    node_local: bool = False  # each SuperNode reads its own directory (dataset=local): no partition
    # the info for given options where they decide the shape by loading (dataset=custom)
    # reads what the options name (a user's function) to learn the shape: (info, options, root)
    resolve: Callable[[DatasetInfo, dict[str, Any], str | None], DatasetInfo] | None = None


def data_roots(root: str | None, defaults: Sequence[str] = ()) -> list[Path]:
    """Directories to search: the configured root alone where one is set (a root the user named
    that lacks the files is an error, never a silent fall-back to another copy); otherwise
    $PFLOWER_DATA, then the defaults."""
    if root:
        return [Path(root).expanduser()]
    out: list[Path] = []
    for candidate in (os.environ.get("PFLOWER_DATA"), *defaults, "~/.cache/pflower/data"):
        if candidate:
            path = Path(candidate).expanduser()
            if path not in out:
                out.append(path)
    return out


# the directories the readers of the current :func:`recording` resolved (one per find_files call)
_READ_FROM: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("pflower_read_from", default=None)


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """Collect where the readers called inside the block read from: each directory that
    :func:`find_files` resolved, and each source a reader notes itself (:func:`note_source`), so
    a run records the files it actually read, not the root it was given."""
    read: list[str] = []
    token = _READ_FROM.set(read)
    try:
        yield read
    finally:
        _READ_FROM.reset(token)


def note_source(where: str) -> None:
    """Record ``where`` (a directory, a hub name) for the surrounding :func:`recording`."""
    read = _READ_FROM.get()
    if read is not None and where not in read:
        read.append(where)


def find_files(
    name: str,
    roots: Sequence[Path],
    required: Sequence[Sequence[str]],
    subdirs: Sequence[str] = ("",),
    how_to_get: str = "",
    user_root: str | None = None,
) -> Path:
    """First ``root/subdir`` holding one name of every alternative group in ``required``.

    ``user_root``: the ``dataset.root`` the user set (``roots`` is then that directory alone),
    so the error names it as the thing to fix."""
    tried = []
    for root in roots:
        for sub in subdirs:
            base = root / sub if sub else root
            tried.append(str(base))
            if all(any((base / alt).exists() for alt in group) for group in required):
                note_source(str(base.resolve()))
                return base
    need = ", ".join(" or ".join(group) for group in required)
    if user_root:
        raise DatasetNotFoundError(
            f"dataset {name!r}: dataset.root={user_root!r} does not hold its files (looked for [{need}] "
            f"in {tried}). Point dataset.root at the directory that holds them, or leave it unset to "
            f"search the default places. {how_to_get}".rstrip()
        )
    raise DatasetNotFoundError(
        f"dataset {name!r} not found: looked for [{need}] in {tried}. {how_to_get} "
        "Point pflower at the files with `dataset.root=/path` (or the PFLOWER_DATA "
        "environment variable)."
    )


def pick(base: Path, names: Sequence[str]) -> Path:
    """The first existing file among alternative names (e.g. with and without .gz)."""
    for n in names:
        if (base / n).exists():
            return base / n
    raise DatasetNotFoundError(f"none of {list(names)} in {base}")


# ----------------------------------------------------------------------------- readers


def digits_table() -> np.ndarray:
    """scikit-learn's bundled digits.csv.gz as ``load_digits`` reads it ([1797, 65]: 64 pixels, the
    label), read from the installed package's file without importing scikit-learn: its import
    (scipy.stats among it) took 1.5-2.8 s of the default run's start-up. Falls back to
    ``load_digits`` where the file is not where scikit-learn 1.x keeps it."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, mode="rt", encoding="utf-8") as f:
                return np.loadtxt(f, delimiter=",")
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return np.concatenate([x, y[:, None]], axis=1)


def read_digits(root: str | None = None) -> Splits:
    """scikit-learn's bundled 8x8 digits, bilinearly upsampled to 1x28x28 (LeNet's MNIST shape)."""
    import torch

    table = digits_table()
    images, labels = table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = torch.nn.functional.interpolate(x, size=(28, 28), mode="bilinear", align_corners=False)
    return {"all": (x.clamp(0, 1).numpy(), labels.astype(np.int64))}


def read_synthetic(
    root: str | None = None,
    num_samples: int = 2000,
    num_classes: int = 10,
    channels: int = 1,
    image_size: int = 28,
    noise: float = 0.25,
    seed: int = 0,
) -> Splits:
    """Seeded class-conditional images: one random template per class plus Gaussian noise."""
    rng = np.random.default_rng(seed)
    templates = rng.random((num_classes, channels, image_size, image_size), dtype=np.float32)
    labels = rng.integers(0, num_classes, size=num_samples).astype(np.int64)
    images = templates[labels] + noise * rng.standard_normal(
        (num_samples, channels, image_size, image_size), dtype=np.float32
    )
    return {"all": (np.clip(images, 0.0, 1.0), labels)}


_FMNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_FMNIST_HOW = (
    "On Debian/Ubuntu: `apt-get install dataset-fashion-mnist` (files land in "
    "/usr/share/datasets/fashion-mnist), or copy the four IDX files from the Fashion-MNIST "
    "release into a directory."
)


def read_fmnist(root: str | None = None) -> Splits:
    """Fashion-MNIST from its IDX files (gzip or not), e.g. Debian's dataset-fashion-mnist."""
    required = [[f, f + ".gz"] for pair in _FMNIST_FILES.values() for f in pair]
    base = find_files(
        "fmnist",
        data_roots(root, DATASETS["fmnist"].default_roots),
        required,
        subdirs=("", "fashion-mnist", "FashionMNIST/raw", "fmnist"),
        how_to_get=_FMNIST_HOW,
        user_root=root,
    )
    out: Splits = {}
    for split, (img, lab) in _FMNIST_FILES.items():
        images = read_idx(pick(base, [img, img + ".gz"]))
        labels = read_idx(pick(base, [lab, lab + ".gz"])).astype(np.int64)
        out[split] = (images[:, None, :, :], labels)
    return out


def _no_pool(root: str | None = None, **options: Any) -> Splits:
    raise ValueError(
        "dataset=local has no shared pool to partition: each SuperNode loads its own data-dir "
        "(federated_data.local.load_local_data)"
    )


DATASETS: dict[str, DatasetInfo] = {
    "digits": DatasetInfo("digits", (1, 28, 28), 10, read_digits, how_to_get="Bundled with scikit-learn."),
    "synthetic": DatasetInfo("synthetic", (1, 28, 28), 10, read_synthetic),
    "local": DatasetInfo(
        "local",
        (1, 28, 28),
        10,
        _no_pool,
        how_to_get="Each SuperNode names its own directory: --node-config \"data-dir='/path'\" "
        "(train.npz, test.npz, meta.json; see federated_data/local.py).",
        node_local=True,
    ),
    "fmnist": DatasetInfo(
        "fmnist",
        (1, 28, 28),
        10,
        read_fmnist,
        mean=(0.2860,),
        std=(0.3530,),
        default_roots=("/usr/share/datasets/fashion-mnist",),
        how_to_get=_FMNIST_HOW,
    ),
}


def register(info: DatasetInfo) -> None:
    """Add a dataset to the registry (the torchvision readers use this)."""
    DATASETS[info.name] = info


def lookup(name: str, root: str | None = None, **options: Any) -> DatasetInfo:
    """Look a registered dataset up by name; ``options`` (synthetic's size, classes...) may change its
    shape, and ``root`` is where a dataset that must be read to know its shape lies (``custom``).
    Use :func:`federated_data.catalog.dataset_info`, which registers every reader first."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid datasets: {sorted(DATASETS)}")
    info = DATASETS[name]
    if info.resolve is not None:
        return info.resolve(info, dict(options), root)
    if (
        name in ("synthetic", "local", "hf") and options
    ):  # shape and classes are options (local, hf: what the data must hold)
        c = int(options.get("channels", info.in_shape[0]))
        s = int(options.get("image_size", info.in_shape[1]))
        k = int(options.get("num_classes", info.num_classes))
        info = replace(info, in_shape=(c, s, s), num_classes=k, options=dict(options))
    return info
