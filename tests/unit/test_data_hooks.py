"""Your data: dataset objects, (images, labels) pairs and image folders as pflower's arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import TensorDataset
from user_code import Digits32

from pflower.federated_data import dataset_info
from pflower.federated_data.datasets import DataHookError, arrays_of, read_image_folder, user_splits


def test_a_map_style_dataset_of_tensors_pil_images_or_rows_becomes_nchw_arrays():
    x, y = arrays_of(Digits32(np.arange(5)))
    assert x.shape == (5, 3, 32, 32) and x.dtype == np.float32 and y.tolist() == [0, 1, 2, 3, 4]
    pil = [(Image.fromarray(np.full((6, 4, 3), i, np.uint8)), i) for i in range(3)]  # HxWxC RGB
    x, y = arrays_of(pil)
    assert x.shape == (3, 3, 6, 4) and x.dtype == np.uint8 and x[2].max() == 2
    rows = [{"image": Image.fromarray(np.zeros((5, 5), np.uint8)), "label": 7}]  # a Hugging Face row, grey
    x, y = arrays_of(rows)
    assert x.shape == (1, 1, 5, 5) and y.tolist() == [7]
    x, y = arrays_of(TensorDataset(torch.rand(4, 2, 3, 3), torch.tensor([1, 0, 1, 0])))
    assert x.shape == (4, 2, 3, 3)


def test_an_images_labels_pair_in_nhwc_or_nhw_is_turned_into_nchw():
    x, _ = arrays_of((np.zeros((7, 8, 8, 3), np.uint8), np.zeros(7)))
    assert x.shape == (7, 3, 8, 8)
    x, _ = arrays_of((torch.zeros(7, 8, 8), torch.zeros(7, dtype=torch.long)))
    assert x.shape == (7, 1, 8, 8)


def test_feature_vectors_are_samples_too_and_keep_their_values():
    """Tabular or sensor data: a pair [N, F] or a dataset of 1-D tensors/arrays is float32 [N, F];
    whole-number features are not pixels (no 0..255 scaling), and no pixel normalisation applies."""
    from pflower.federated_data.tensors import normalize

    x, y = arrays_of((np.arange(12, dtype=np.int64).reshape(4, 3), np.array([0, 1, 0, 1])))
    assert x.shape == (4, 3) and x.dtype == np.float32 and x[3].tolist() == [9.0, 10.0, 11.0]
    x2, _ = arrays_of(TensorDataset(torch.arange(12.0).reshape(4, 3), torch.tensor([0, 1, 0, 1])))
    assert np.array_equal(x, x2)
    x3, _ = arrays_of([(np.array([200, 255], np.uint8), 1)])  # uint8 features stay their values
    assert x3.dtype == np.float32 and x3.tolist() == [[200.0, 255.0]]
    assert torch.equal(normalize(x, np.zeros(0, np.float32), np.ones(0, np.float32)), torch.from_numpy(x))


@pytest.mark.parametrize(
    "data, message",
    [
        (42, "pass a map-style dataset"),
        ([], "is empty"),
        ([(np.zeros((3, 3)), 0), (np.zeros((4, 4)), 1)], "samples of different shapes"),
        ([(np.zeros((2, 3, 4, 5)), 0)], "a sample must be a vector [F] or an image HxW, CxHxW or HxWxC"),
        ([(np.array(["a", "b"]), 0)], "a vector of dtype <U1; use numbers"),
        ([np.zeros((3, 3))], "items must be (image, label)"),
        ([{"pixels": 1, "label": 0}], "pflower reads 'image' and 'label'"),
        ((np.zeros((3, 4, 4)), np.zeros(2)), "pass images [N, C, H, W] or feature vectors [N, F], and labels [N]"),
    ],
)
def test_data_pflower_cannot_read_is_refused_with_what_it_must_be(data, message):
    with pytest.raises(DataHookError) as err:
        arrays_of(data, "my data")
    assert message in str(err.value) and "my data" in str(err.value)


def test_a_data_function_may_return_one_dataset_a_pair_or_named_splits():
    one = user_splits(Digits32(np.arange(4)), "f")
    assert list(one) == ["all"]
    pair = user_splits((Digits32(np.arange(4)), Digits32(np.arange(4, 6))), "f")
    assert list(pair) == ["train", "test"] and len(pair["test"][1]) == 2
    with pytest.raises(DataHookError, match="use 'train' and optionally 'test'"):
        user_splits({"training": Digits32(np.arange(4))}, "f")


def test_dataset_custom_reads_its_shape_and_classes_from_the_users_function():
    info = dataset_info("custom", target="user_code:load_digits32", size=50)
    assert info.in_shape == (3, 32, 32) and info.num_classes == 10
    with pytest.raises(ValueError, match="dataset.options.target='user_code:nope'"):
        dataset_info("custom", target="user_code:nope")


def test_an_image_folder_is_read_resized_with_the_sorted_class_folders_as_labels(tmp_path):
    for cls, value in (("cat", 10), ("ant", 200)):
        (tmp_path / cls).mkdir()
        for i in range(2):
            Image.fromarray(np.full((12, 10, 3), value + i, np.uint8)).save(tmp_path / cls / f"{i}.png")
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    x, y = read_image_folder(tmp_path, (3, 8, 8))
    assert x.shape == (4, 3, 8, 8) and x.dtype == np.uint8
    assert y.tolist() == [0, 0, 1, 1]  # ant = 0, cat = 1 (torchvision's order)
    assert x[0].min() == 200 and x[3].max() == 11
    grey, _ = read_image_folder(tmp_path, (1, 4, 4), classes=["cat", "ant"])
    assert grey.shape == (4, 1, 4, 4)
    with pytest.raises(DataHookError, match="no images"):
        read_image_folder(tmp_path / "cat", (3, 8, 8))


def test_a_node_directory_of_image_folders_is_a_nodes_data(tmp_path):
    """dataset=local: a SuperNode's data-dir in ImageFolder layout, meta.json fixing the class order."""
    import json

    from pflower.federated_data import DataSpec
    from pflower.federated_data.datasets import write_image_folder
    from pflower.federated_data.local import LocalDataError, load_local_data

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 1, 8, 8), dtype=np.uint8)
    labels = np.array([0, 1, 2] * 4)
    write_image_folder(tmp_path / "train", images[:9], labels[:9], ["zero", "one", "two"])
    write_image_folder(tmp_path / "test", images[9:], labels[9:], ["zero", "one", "two"])
    (tmp_path / "meta.json").write_text(json.dumps({"name": "shapes", "classes": ["zero", "one", "two"]}))
    options = {"channels": 1, "image_size": 8, "num_classes": 3}
    spec = DataSpec.from_dict({"dataset": "local", "root": str(tmp_path), "options": options})
    data = load_local_data(spec, client_id=0)
    assert (data.num_train, data.num_test) == (9, 3)
    assert data.y_train.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # "one" is label 1 although it sorts first
    assert data.extra["meta"]["format"] == "imagefolder"
    # the pixels are the images written, class by class, normalized by the node's own statistics
    unit = images[[0, 3, 6, 1, 4, 7, 2, 5, 8]].astype(np.float32) / 255.0
    expected = (unit - unit.mean()) / (unit.std() + 1e-8)
    assert np.allclose(data.x_train.numpy(), expected, atol=1e-5)
    (tmp_path / "test" / "three").mkdir()
    (tmp_path / "test" / "three" / "a.png").write_bytes(next((tmp_path / "test" / "one").glob("*.png")).read_bytes())
    with pytest.raises(LocalDataError, match=r"class folders \['three'\]"):
        load_local_data(spec, client_id=0)
