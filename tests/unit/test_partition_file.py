"""partition=file: the clients of a JSON file, the same indices another code trained, and a clear
error for every way the file can disagree with the run."""

import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from pflower.federated_data.client_data import DataSpec, client_indices, load_client_data, partition_sizes
from pflower.federated_data.partition import PartitionError
from pflower.server_app.config import ConfigError, compose_config

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ is a folder of the checkout, not an installed package

from benchmarks.authors.flbench_partition import main as convert  # noqa: E402


def _write(tmp_path, data, name="p.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_a_written_partition_is_read_back_index_for_index(tmp_path):
    drawn = DataSpec(dataset="digits", num_clients=4, alpha=0.5, seed=3)
    parts = [client_indices(drawn, i) for i in range(4)]
    path = _write(tmp_path, {"clients": [{"train": tr.tolist(), "test": te.tolist()} for tr, te in parts]})
    given = DataSpec(dataset="digits", num_clients=4, partitioner="file", partition_path=path, seed=99)
    for i, (tr, te) in enumerate(parts):
        got_tr, got_te = client_indices(given, i)
        assert np.array_equal(got_tr, tr) and np.array_equal(got_te, te)
    assert partition_sizes(given) == [len(tr) + len(te) for tr, te in parts]
    a, b = load_client_data(drawn, 2), load_client_data(given, 2)
    assert np.array_equal(a.y_test.numpy(), b.y_test.numpy()) and bool((a.x_train == b.x_train).all())


def test_a_client_given_as_one_list_is_split_by_test_fraction(tmp_path):
    path = _write(tmp_path, {"clients": [list(range(0, 10)), list(range(10, 30))]})
    spec = DataSpec(dataset="digits", num_clients=2, partitioner="file", partition_path=path, test_fraction=0.5)
    train, test = client_indices(spec, 1)
    assert (len(train), len(test)) == (10, 10)
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(10, 30))


@pytest.mark.parametrize(
    ("data", "clients", "match"),
    [
        ({"clients": [[0, 1], [2, 3]]}, 3, r"holds 2 clients but num_clients=3: set num_clients=2"),
        ({"clients": [[0, 1], [2, 99999]]}, 2, r"client 1 holds index 99999 outside the pooled dataset's 0\.\.1796"),
        ({"clients": [[0, 1], {"train": [2]}]}, 2, r"client 1 must have exactly 'train' and 'test' lists"),
        ({"clients": [[0, 1], {"train": [2], "test": []}]}, 2, r"client 1 has an empty train or test list"),
        ({"clients": [[0, 1], [2.5, 3]]}, 2, r"client 1 must be a list of integer sample indices"),
        ({"clients": [[0, 1], [2]]}, 2, r"client 1 holds 1 samples; a client needs 2"),
        ({"parts": [[0, 1]]}, 1, r"unknown keys \['parts'\]"),
    ],
)
def test_a_file_that_disagrees_with_the_run_says_what_to_change(tmp_path, data, clients, match):
    spec = DataSpec(dataset="digits", num_clients=clients, partitioner="file", partition_path=_write(tmp_path, data))
    with pytest.raises(PartitionError, match=match):
        client_indices(spec, 0)


def test_a_missing_or_broken_file_is_named(tmp_path):
    missing = DataSpec(dataset="digits", num_clients=2, partitioner="file", partition_path=str(tmp_path / "no.json"))
    with pytest.raises(PartitionError, match=r"no\.json' cannot be read .*give an existing file"):
        client_indices(missing, 0)
    (tmp_path / "bad.json").write_text("{clients: ")
    broken = DataSpec(dataset="digits", num_clients=2, partitioner="file", partition_path=str(tmp_path / "bad.json"))
    with pytest.raises(PartitionError, match=r"is not JSON"):
        client_indices(broken, 0)


def test_the_config_refuses_partition_file_without_a_path():
    with pytest.raises(ConfigError, match=r"partition=file needs partition.path="):
        compose_config(["partition=file", "dataset=digits"])


def test_an_flbench_partition_converts_to_the_same_clients(tmp_path):
    pkl = tmp_path / "partition.pkl"
    with pkl.open("wb") as f:
        pickle.dump(
            {
                "separation": None,
                "data_indices": [{"train": np.array([0, 5]), "test": [7]}, {"train": [1], "test": [2, 3]}],
            },
            f,
        )
    convert([str(pkl), str(tmp_path / "out.json")])
    spec = DataSpec(dataset="digits", num_clients=2, partitioner="file", partition_path=str(tmp_path / "out.json"))
    assert [t.tolist() for t in client_indices(spec, 0)] == [[0, 5], [7]]
    assert [t.tolist() for t in client_indices(spec, 1)] == [[1], [2, 3]]
