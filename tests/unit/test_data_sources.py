"""Offline dataset readers, checked on tiny files written in each dataset's real on-disk format."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import pflower.federated_data.medmnist_sources  # noqa: F401  (registers organamnist, organcmnist)
import pflower.federated_data.torchvision_sources as tvs
from pflower.federated_data import DATASETS, DatasetNotFoundError, dataset_info
from pflower.federated_data.idx import write_idx

TORCHVISION_NAMES = ("mnist", "emnist", "cifar10", "cifar100", "svhn", "cinic10", "tinyimagenet")
FMNIST_DEBIAN = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(autouse=True)
def _isolated_roots(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Keep $PFLOWER_DATA and ~/.cache/pflower/data of this machine out of the search."""
    monkeypatch.delenv("PFLOWER_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))


def _read(name: str, root: Path):
    return DATASETS[name].reader(str(root))


def _random_images(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, 256, size=shape, dtype=np.uint8)


def _check_splits(splits, name: str, sizes: dict[str, int]) -> None:
    """Shapes, dtypes and label range every reader must honour."""
    info = DATASETS[name]
    assert set(splits) == set(sizes)
    for split, (images, labels) in splits.items():
        assert images.dtype == np.uint8
        assert images.shape == (sizes[split], *info.in_shape)
        assert labels.dtype == np.int64 and labels.shape == (sizes[split],)
        assert labels.min() >= 0 and labels.max() < info.num_classes


# ----------------------------------------------------------------------------- registry


@pytest.mark.parametrize("name", TORCHVISION_NAMES)
def test_registered_with_stats_and_instructions(name: str) -> None:
    info = dataset_info(name)
    assert info.name == name
    assert len(info.mean) == len(info.std) == info.in_shape[0]
    assert all(0 < m < 1 for m in info.mean) and all(0 < s < 1 for s in info.std)
    assert "ROOT" in info.how_to_get


@pytest.mark.parametrize("name", TORCHVISION_NAMES)
def test_missing_root_names_searched_dirs_and_how_to_get(name: str, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetNotFoundError) as err:  # the user's dataset.root: only it is searched
        _read(name, missing)
    message = str(err.value)
    assert f"dataset.root={str(missing)!r} does not hold its files" in message
    assert str(Path.home() / ".cache/pflower/data") not in message
    assert DATASETS[name].how_to_get in message
    with pytest.raises(DatasetNotFoundError) as err:  # no root: the default places, named
        DATASETS[name].reader(None)
    assert str(Path.home() / ".cache/pflower/data") in str(err.value) and "dataset.root=/path" in str(err.value)


# ----------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_reads_torchvision_raw_folder(tmp_path: Path, gz: bool) -> None:
    rng = np.random.default_rng(0)
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    ext = ".gz" if gz else ""
    data = {
        "train": (_random_images(rng, (6, 28, 28)), np.arange(6) % 10),
        "test": (_random_images(rng, (4, 28, 28)), np.array([9, 8, 7, 6])),
    }
    for split, prefix in (("train", "train"), ("test", "t10k")):
        write_idx(raw / f"{prefix}-images-idx3-ubyte{ext}", data[split][0])
        write_idx(raw / f"{prefix}-labels-idx1-ubyte{ext}", data[split][1])
    splits = _read("mnist", tmp_path)
    _check_splits(splits, "mnist", {"train": 6, "test": 4})
    for split, (images, labels) in data.items():
        np.testing.assert_array_equal(splits[split][0][:, 0], images)
        np.testing.assert_array_equal(splits[split][1], labels)


def test_emnist_transposes_images_upright(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    raw = tmp_path / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    stored = {"train": _random_images(rng, (6, 28, 28)), "test": _random_images(rng, (4, 28, 28))}
    labels = {"train": np.array([0, 10, 35, 36, 61, 5]), "test": np.array([61, 0, 1, 2])}
    for split in stored:
        ext = ".gz" if split == "train" else ""
        write_idx(raw / f"emnist-byclass-{split}-images-idx3-ubyte{ext}", stored[split])
        write_idx(raw / f"emnist-byclass-{split}-labels-idx1-ubyte{ext}", labels[split])
    splits = _read("emnist", tmp_path)
    _check_splits(splits, "emnist", {"train": 6, "test": 4})
    for split in stored:
        np.testing.assert_array_equal(splits[split][0][:, 0], stored[split].transpose(0, 2, 1))
        np.testing.assert_array_equal(splits[split][1], labels[split])


def test_in_place_transpose_spans_chunks() -> None:
    images = _random_images(np.random.default_rng(2), (11, 5, 5))
    expected = images.transpose(0, 2, 1).copy()
    tvs._transpose_in_place(images, chunk=4)
    np.testing.assert_array_equal(images, expected)


def test_fmnist_reads_idx_files_in_any_dir(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    train, test = _random_images(rng, (6, 28, 28)), _random_images(rng, (4, 28, 28))
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", train)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(6))
    write_idx(tmp_path / "t10k-images-idx3-ubyte", test)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([1, 2, 3, 4]))
    splits = _read("fmnist", tmp_path)
    _check_splits(splits, "fmnist", {"train": 6, "test": 4})
    np.testing.assert_array_equal(splits["train"][0][:, 0], train)
    np.testing.assert_array_equal(splits["test"][0][:, 0], test)
    np.testing.assert_array_equal(splits["test"][1], [1, 2, 3, 4])


def _write_fmnist(folder: Path, seed: int = 3, n: int = 6) -> None:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    write_idx(folder / "train-images-idx3-ubyte", _random_images(rng, (n, 28, 28)))
    write_idx(folder / "train-labels-idx1-ubyte", np.arange(n) % 10)
    write_idx(folder / "t10k-images-idx3-ubyte", _random_images(rng, (4, 28, 28)))
    write_idx(folder / "t10k-labels-idx1-ubyte", np.array([1, 2, 3, 4]))


def test_an_explicit_root_is_the_only_place_searched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """dataset.root names the data: a root without the files is an error even where another copy
    ($PFLOWER_DATA, the Debian package) would be found without it."""
    _write_fmnist(tmp_path / "elsewhere")
    monkeypatch.setenv("PFLOWER_DATA", str(tmp_path / "elsewhere"))
    with pytest.raises(DatasetNotFoundError, match="does not hold its files"):
        DATASETS["fmnist"].reader(str(tmp_path / "empty"))
    assert len(DATASETS["fmnist"].reader(None)["train"][1]) == 6  # no root: $PFLOWER_DATA is searched


def test_the_data_read_is_recorded_with_a_fingerprint(tmp_path: Path) -> None:
    """data_origin names the directory that held the files (a sub-folder found under the root) and a
    sha256 of the arrays read: the same files elsewhere give the same one, one changed label another."""
    from pflower.federated_data import DataSpec, data_origin
    from pflower.federated_data.client_data import fingerprint

    _write_fmnist(tmp_path / "a" / "fashion-mnist")
    _write_fmnist(tmp_path / "b")
    _write_fmnist(tmp_path / "c", n=7)
    origin = data_origin(DataSpec(dataset="fmnist", root=str(tmp_path / "a"), num_clients=2))
    assert origin["data_dir"] == str((tmp_path / "a" / "fashion-mnist").resolve())
    splits = DATASETS["fmnist"].reader(str(tmp_path / "a"))
    assert origin["data_sha256"] == fingerprint(splits) and len(origin["data_sha256"]) == 64
    same = data_origin(DataSpec(dataset="fmnist", root=str(tmp_path / "b"), num_clients=2))
    assert same["data_sha256"] == origin["data_sha256"] and same["data_dir"] == str((tmp_path / "b").resolve())
    other = data_origin(DataSpec(dataset="fmnist", root=str(tmp_path / "c"), num_clients=2))
    assert other["data_sha256"] != origin["data_sha256"]
    digits = data_origin(DataSpec(dataset="digits"))
    assert digits["data_dir"] == "scikit-learn's bundled load_digits()" and len(digits["data_sha256"]) == 64


@pytest.mark.skipif(not FMNIST_DEBIAN.is_dir(), reason="dataset-fashion-mnist is not installed")
def test_debian_fashion_mnist_loads() -> None:
    splits = DATASETS["fmnist"].reader(None)
    _check_splits(splits, "fmnist", {"train": 60000, "test": 10000})
    pooled = np.concatenate([labels for _, labels in splits.values()])
    assert len(pooled) == 70000
    assert np.bincount(pooled).tolist() == [7000] * 10


def test_digits_is_float_in_unit_range() -> None:
    images, labels = DATASETS["digits"].reader(None)["all"]
    assert images.shape == (1797, 1, 28, 28) and images.dtype == np.float32
    assert images.min() >= 0.0 and images.max() <= 1.0
    assert labels.dtype == np.int64 and set(labels.tolist()) == set(range(10))


# ----------------------------------------------------------------------------- CIFAR


def _cifar_batch(rng: np.random.Generator, n: int, label_key: str, num_classes: int, as_bytes: bool) -> dict:
    rows = _random_images(rng, (n, 3072))
    batch = {"data": rows, label_key: rng.integers(0, num_classes, n).tolist(), "filenames": []}
    if as_bytes:  # how the Python 2 pickles read with encoding="bytes" look
        batch = {k.encode(): v for k, v in batch.items()}
    return batch


def _check_cifar_rows(images: np.ndarray, rows: np.ndarray) -> None:
    """Rows are 1024 red, then green, then blue values, each row-major 32x32."""
    np.testing.assert_array_equal(images[:, 0], rows[:, :1024].reshape(-1, 32, 32))
    np.testing.assert_array_equal(images[:, 2], rows[:, 2048:].reshape(-1, 32, 32))
    np.testing.assert_array_equal(images.reshape(len(rows), -1), rows)


def test_cifar10_reads_pickled_batches(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    sizes = {n: 4 if n == "test_batch" else 2 for n in names}
    batches = {n: _cifar_batch(rng, sizes[n], "labels", 10, as_bytes=True) for n in names}
    for n, batch in batches.items():
        (base / n).write_bytes(pickle.dumps(batch, protocol=2))
    splits = _read("cifar10", tmp_path)
    _check_splits(splits, "cifar10", {"train": 10, "test": 4})
    train_rows = np.concatenate([batches[n][b"data"] for n in names[:5]])
    _check_cifar_rows(splits["train"][0], train_rows)
    _check_cifar_rows(splits["test"][0], batches["test_batch"][b"data"])
    expected = sum((batches[n][b"labels"] for n in names[:5]), [])
    np.testing.assert_array_equal(splits["train"][1], expected)


def test_cifar100_uses_fine_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    base = tmp_path / "cifar-100-python"
    base.mkdir()
    batches = {  # str keys: how the Python 2 pickles read with encoding="latin1" look
        "train": _cifar_batch(rng, 6, "fine_labels", 100, as_bytes=False),
        "test": _cifar_batch(rng, 4, "fine_labels", 100, as_bytes=False),
    }
    for split, batch in batches.items():
        batch["coarse_labels"] = [0] * len(batch["fine_labels"])
        (base / split).write_bytes(pickle.dumps(batch, protocol=2))
    splits = _read("cifar100", tmp_path)
    _check_splits(splits, "cifar100", {"train": 6, "test": 4})
    for split, batch in batches.items():
        _check_cifar_rows(splits[split][0], batch["data"])
        np.testing.assert_array_equal(splits[split][1], batch["fine_labels"])


# ----------------------------------------------------------------------------- SVHN


@pytest.mark.parametrize("subdir", ["svhn", ""])
def test_svhn_maps_label_ten_to_zero(tmp_path: Path, subdir: str) -> None:
    from scipy.io import savemat

    rng = np.random.default_rng(6)
    base = tmp_path / subdir
    base.mkdir(exist_ok=True)
    data = {
        "train": (_random_images(rng, (32, 32, 3, 6)), np.array([[10], [1], [2], [10], [9], [5]])),
        "test": (_random_images(rng, (32, 32, 3, 4)), np.array([[3], [10], [4], [1]])),
    }
    for split, (x, y) in data.items():
        savemat(base / f"{split}_32x32.mat", {"X": x, "y": y.astype(np.uint8)})
    splits = _read("svhn", tmp_path)
    _check_splits(splits, "svhn", {"train": 6, "test": 4})
    for split, (x, y) in data.items():
        np.testing.assert_array_equal(splits[split][0], x.transpose(3, 2, 0, 1))
        np.testing.assert_array_equal(splits[split][1], np.where(y[:, 0] == 10, 0, y[:, 0]))
    assert splits["train"][1].tolist() == [0, 1, 2, 0, 9, 5]


# ----------------------------------------------------------------------------- image folders


def _save(path: Path, pixels: np.ndarray) -> None:
    """Write an HxWx3 (or HxW grayscale) uint8 array as an image file, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def test_cinic10_reads_png_folders_and_skips_valid(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    base = tmp_path / "cinic10"
    classes = ["airplane", "cat", "truck"]  # sorted order gives indices 0, 1, 2
    written: dict[str, dict[int, list[np.ndarray]]] = {"train": {}, "test": {}}
    for split, per_class in (("train", 2), ("test", 1), ("valid", 3)):
        for c, cls in enumerate(classes):
            for i in range(per_class):
                pixels = _random_images(rng, (32, 32, 3))
                _save(base / split / cls / f"cifar10-{split}-{i}.png", pixels)
                written.get(split, {}).setdefault(c, []).append(pixels)
    splits = _read("cinic10", tmp_path)
    _check_splits(splits, "cinic10", {"train": 6, "test": 3})
    for split, per_class in written.items():
        images, labels = splits[split]
        expected = [(c, p) for c in sorted(per_class) for p in per_class[c]]
        np.testing.assert_array_equal(labels, [c for c, _ in expected])
        for got, (_, pixels) in zip(images, expected):
            np.testing.assert_array_equal(got, pixels.transpose(2, 0, 1))  # PNG is lossless


def test_image_of_wrong_size_is_rejected(tmp_path: Path) -> None:
    for split in ("train", "test"):
        _save(tmp_path / "cinic10" / split / "cat" / "a.png", np.zeros((31, 32, 3), np.uint8))
    with pytest.raises(ValueError, match="expected 32x32"):
        _read("cinic10", tmp_path)


def test_tinyimagenet_train_folders_and_annotated_val(tmp_path: Path) -> None:
    base = tmp_path / "tiny-imagenet-200"
    wnids = ["n09999999", "n01443537", "n02085620"]  # class index follows the sorted wnids
    base.mkdir()
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
    colors = {w: 40 + 80 * i for i, w in enumerate(sorted(wnids))}  # flat images survive JPEG
    for w in wnids:
        for i in range(2):
            flat = np.full((64, 64, 3), colors[w], np.uint8)
            _save(base / "train" / w / "images" / f"{w}_{i}.JPEG", flat)
        (base / "train" / w / f"{w}_boxes.txt").write_text("")
    _save(base / "train" / wnids[0] / "images" / "gray.JPEG", np.full((64, 64), 10, np.uint8))
    val = [(f"val_{i}.JPEG", wnids[k]) for i, k in enumerate([2, 0, 1, 0])]
    for fname, w in val:
        _save(base / "val" / "images" / fname, np.full((64, 64, 3), colors[w], np.uint8))
    (base / "val" / "val_annotations.txt").write_text("".join(f"{fname}\t{w}\t0\t0\t63\t63\n" for fname, w in val))
    _save(base / "test" / "images" / "test_0.JPEG", np.zeros((64, 64, 3), np.uint8))  # unlabelled
    splits = _read("tinyimagenet", tmp_path)
    _check_splits(splits, "tinyimagenet", {"train": 7, "test": 4})
    index = {w: i for i, w in enumerate(sorted(wnids))}
    images, labels = splits["test"]
    np.testing.assert_array_equal(labels, [index[w] for _, w in val])
    for got, (_, w) in zip(images, val):
        assert np.abs(got.astype(int) - colors[w]).max() <= 2
    train_images, train_labels = splits["train"]
    assert np.bincount(train_labels).tolist() == [2, 2, 3]  # n09999999 (index 2) has the gray one
    gray = train_images[np.all(np.abs(train_images.astype(int) - 10) <= 2, axis=(1, 2, 3))]
    assert len(gray) == 1 and gray.shape[1] == 3  # grayscale JPEG came back as RGB


# ----------------------------------------------------------------------------- MedMNIST .npz


def _write_medmnist(path: Path, rng: np.random.Generator, sizes=(5, 2, 3), side: int = 28, **drop) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for split, n in zip(("train", "val", "test"), sizes):
        arrays[f"{split}_images"] = _random_images(rng, (n, side, side))
        arrays[f"{split}_labels"] = rng.integers(0, 11, size=(n, 1)).astype(np.uint8)  # as shipped: [N, 1]
    for key in drop:
        arrays.pop(key)
    np.savez_compressed(path, **arrays)
    return arrays


@pytest.mark.parametrize("name, subdir", [("organamnist", ""), ("organcmnist", "medmnist")])
def test_medmnist_npz_pools_val_into_train(tmp_path: Path, name: str, subdir: str) -> None:
    arrays = _write_medmnist(tmp_path / subdir / f"{name}.npz", np.random.default_rng(8))
    splits = _read(name, tmp_path)
    _check_splits(splits, name, {"train": 7, "test": 3})
    np.testing.assert_array_equal(
        splits["train"][0][:, 0], np.concatenate([arrays["train_images"], arrays["val_images"]])
    )
    np.testing.assert_array_equal(
        splits["train"][1], np.concatenate([arrays["train_labels"], arrays["val_labels"]])[:, 0]
    )
    np.testing.assert_array_equal(splits["test"][1], arrays["test_labels"][:, 0])


def test_medmnist_is_found_in_the_medmnist_package_cache(tmp_path: Path) -> None:
    _write_medmnist(Path.home() / ".medmnist" / "organamnist.npz", np.random.default_rng(9))
    assert len(DATASETS["organamnist"].reader(None)["test"][1]) == 3  # no dataset.root: the default places
    with pytest.raises(
        DatasetNotFoundError, match="does not hold its files"
    ):  # a root that lacks it: never another copy
        _read("organamnist", tmp_path / "elsewhere")


@pytest.mark.parametrize(
    "kwargs, match",
    [({"side": 64}, "organamnist_64.npz"), ({"val_labels": True}, r"lacks \['val_labels'\]")],
)
def test_medmnist_wrong_file_is_named_with_the_fix(tmp_path: Path, kwargs: dict, match: str) -> None:
    _write_medmnist(tmp_path / "organamnist.npz", np.random.default_rng(10), **kwargs)
    with pytest.raises(ValueError, match=match) as err:
        _read("organamnist", tmp_path)
    assert str(tmp_path / "organamnist.npz") in str(err.value)


def test_medmnist_missing_file_says_where_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="organcmnist.npz") as err:
        _read("organcmnist", tmp_path)
    assert DATASETS["organcmnist"].how_to_get in str(err.value) and str(tmp_path) in str(err.value)


# ----------------------------------------------------------------------------- Hugging Face datasets


def _write_parquet_dataset(root: Path, sizes: dict[str, int], side: int = 28, mode: str = "L") -> dict:
    """A local directory in the layout the hub uses (data/<split>-00000-of-00001.parquet)."""
    import datasets

    rng = np.random.default_rng(11)
    features = datasets.Features({"img": datasets.Image(), "fine_label": datasets.ClassLabel(num_classes=4)})
    written = {}
    for split, n in sizes.items():
        shape = (n, side, side) if mode == "L" else (n, side, side, 3)
        pixels, labels = _random_images(rng, shape), rng.integers(0, 4, n)
        images = [Image.fromarray(p, mode=mode) for p in pixels]
        ds = datasets.Dataset.from_dict({"img": images, "fine_label": labels.tolist()}, features=features)
        (root / "data").mkdir(parents=True, exist_ok=True)
        ds.to_parquet(root / "data" / f"{split}-00000-of-00001.parquet")
        written[split] = (pixels, labels)
    return written


@pytest.mark.parametrize("mode, channels", [("L", 1), ("RGB", 3)])
def test_hf_dataset_finds_image_and_label_columns(tmp_path: Path, mode: str, channels: int) -> None:
    written = _write_parquet_dataset(tmp_path / "ds", {"train": 6, "test": 3}, side=8, mode=mode)
    info = dataset_info("hf", path=str(tmp_path / "ds"), channels=channels, image_size=8, num_classes=4)
    assert info.in_shape == (channels, 8, 8) and info.num_classes == 4
    splits = info.reader(str(tmp_path / "cache"), **info.options)
    for split, (pixels, labels) in written.items():
        expected = pixels[:, None] if channels == 1 else pixels.transpose(0, 3, 1, 2)
        np.testing.assert_array_equal(splits[split][0], expected)
        np.testing.assert_array_equal(splits[split][1], labels)
        assert splits[split][1].dtype == np.int64


@pytest.mark.parametrize(
    "options, match",
    [
        ({"image_size": 28}, "image_size=8"),
        ({"num_classes": 2}, "num_classes"),
        ({"label_column": "nope"}, "label_column"),
    ],
)
def test_hf_dataset_that_does_not_match_the_options_names_the_fix(tmp_path: Path, options: dict, match: str) -> None:
    _write_parquet_dataset(tmp_path / "ds", {"train": 5}, side=8)
    info = dataset_info("hf", **{"path": str(tmp_path / "ds"), "image_size": 8, "num_classes": 4, **options})
    with pytest.raises(ValueError, match=match):
        info.reader(str(tmp_path / "cache"), **info.options)


def test_hf_hub_id_offline_and_not_cached_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    info = dataset_info("hf", path="zalando-datasets/fashion_mnist")
    with pytest.raises(DatasetNotFoundError, match="zalando-datasets/fashion_mnist") as err:
        info.reader(str(tmp_path / "cache"), **info.options)
    assert "HF cache" in str(err.value)


@pytest.mark.heavy  # over 1 s: imports scikit-learn to compare
def test_digits_are_read_without_importing_scikit_learn_and_equal_load_digits() -> None:
    """The default run's data: scikit-learn's own file, read without its 1.5-2.8 s import, the same
    pixels and labels as ``load_digits`` (so every digits number stays as it was)."""
    import subprocess
    import sys

    probe = (
        "import sys; from pflower.federated_data.sources import read_digits; read_digits(); "
        "print('sklearn' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "False"
    from sklearn.datasets import load_digits

    from pflower.federated_data.sources import digits_table

    bunch, table = load_digits(), digits_table()
    assert np.array_equal(table[:, :-1].reshape(-1, 8, 8), bunch.images)
    assert np.array_equal(table[:, -1].astype(int), bunch.target)
