"""Node-local data (dataset=local): export, load, equality with the simulation, clear errors."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pflower.client_app.runtime import client_data
from pflower.federated_data import DataSpec, load_client_data, partition_sizes
from pflower.federated_data.export import export_partitions
from pflower.federated_data.local import LocalDataError, load_local_data, with_node_data_dir, write_local_dir

ROOT = Path(__file__).resolve().parents[2]
SIM = DataSpec(dataset="digits", num_clients=3, alpha=1.0, min_size=20)


def local_spec(root, **options) -> DataSpec:
    return DataSpec(dataset="local", root=str(root), options=tuple(sorted(options.items())))


def test_exported_partitions_load_to_exactly_the_simulated_tensors(tmp_path):
    paths = export_partitions(SIM, tmp_path)
    assert [p.name for p in paths] == ["client_0", "client_1", "client_2"]
    for cid, path in enumerate(paths):
        sim, node = load_client_data(SIM, cid), load_local_data(local_spec(path), cid)
        for name in ("x_train", "y_train", "x_test", "y_test"):
            assert torch.equal(getattr(sim, name), getattr(node, name)), (cid, name)
        assert node.num_classes == sim.num_classes == 10
        meta = json.loads((path / "meta.json").read_text())
        assert meta["client_id"] == cid and meta["in_shape"] == [1, 28, 28] and meta["exported_from"]["seed"] == 42


def test_export_script_uses_the_same_composition_as_the_simulation(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("export_partitions_script", ROOT / "scripts" / "export_partitions.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--out", str(tmp_path), "num_clients=3", "alpha=1.0", "partition.min_size=20"]) == 0
    assert "dataset='local' num_clients=3" in capsys.readouterr().out
    node = load_local_data(local_spec(tmp_path / "client_1"), 1)
    assert torch.equal(node.x_test, load_client_data(SIM, 1).x_test)


def test_the_server_has_no_partition_to_check_and_the_node_brings_its_directory(tmp_path, compose):
    from pflower.server_app.runner import check_data

    cfg = compose("dataset=local", "num_clients=3")
    assert check_data(cfg) == [] and partition_sizes(cfg.data) == []
    export_partitions(SIM, tmp_path, clients=[2])
    spec = {"data": cfg.data_fields}
    data = client_data(spec, 2, {"client-id": 2, "data-dir": str(tmp_path / "client_2")})
    assert torch.equal(data.y_train, load_client_data(SIM, 2).y_train)
    with pytest.raises(LocalDataError, match="data-dir"):
        client_data(spec, 2, {"client-id": 2})
    # a partitioned dataset ignores data-dir: the spec passes through unchanged
    assert with_node_data_dir({"dataset": "digits", "root": None}, {"data-dir": "/x"})["root"] is None


def _write(path, n=12, shape=(1, 28, 28), classes=10, dtype=np.uint8, **meta):
    rng = np.random.default_rng(0)
    images = (
        rng.integers(0, 256, size=(n, *shape)).astype(dtype)
        if dtype == np.uint8
        else rng.random((n, *shape), dtype=np.float32)
    )
    labels = np.arange(n) % classes
    return write_local_dir(path, (images, labels), (images[:4], labels[:4]), name="mine", num_classes=classes, **meta)


def test_own_data_without_stats_is_normalized_with_its_training_split(tmp_path):
    path = _write(tmp_path / "n", n=64)
    data = load_local_data(local_spec(path), 0)
    assert data.x_train.dtype == torch.float32 and data.num_train == 64 and data.num_test == 4
    assert abs(float(data.x_train.mean())) < 1e-4 and abs(float(data.x_train.std()) - 1) < 0.02


@pytest.mark.parametrize(
    "setup, options, match",
    [
        (lambda p: _write(p, shape=(3, 32, 32)), {}, "in_shape"),
        (lambda p: _write(p, classes=5), {}, "num_classes"),
        (lambda p: _write(p, client_id=7), {}, "client 7"),
        (lambda p: _write(p), {"meta_name": "cifar10"}, "expects 'cifar10'"),
        (lambda p: p.mkdir(), {}, "lacks"),
    ],
)
def test_a_directory_that_does_not_fit_is_refused_with_the_reason(tmp_path, setup, options, match):
    setup(tmp_path / "n")
    with pytest.raises(LocalDataError, match=match):
        load_local_data(local_spec(tmp_path / "n", **options), 0)


def test_bad_arrays_are_refused(tmp_path):
    path = _write(tmp_path / "n", dtype=np.float32)
    np.savez(path / "train.npz", images=np.full((4, 1, 28, 28), 2.0, np.float32), labels=np.zeros(4, np.int64))
    with pytest.raises(LocalDataError, match=r"\[0, 1\]"):
        load_local_data(local_spec(path), 0)
    np.savez(path / "train.npz", images=np.zeros((4, 1, 28, 28), np.uint8), labels=np.full(4, 10))
    with pytest.raises(LocalDataError, match="labels"):
        load_local_data(local_spec(path), 0)


def test_the_shape_nodes_must_hold_is_a_server_option(tmp_path):
    path = _write(tmp_path / "n", shape=(3, 32, 32), classes=100)
    spec = local_spec(path, channels=3, image_size=32, num_classes=100)
    assert spec.info.in_shape == (3, 32, 32) and spec.info.num_classes == 100 and spec.info.node_local
    assert load_local_data(spec, 0).x_train.shape == (12, 3, 32, 32)


def test_a_run_on_node_data_records_the_partition_the_nodes_hold(tmp_path, compose):
    """The config's alpha (0.3 by default) says nothing about node-held data: the summary and the
    report take what the nodes' meta.json says (exported with alpha 1.0 from digits)."""
    from pflower.reports.report import group_runs
    from pflower.server_app.runner import run_experiment
    from pflower.simulation.inprocess import InProcessGrid

    export_partitions(SIM, tmp_path / "nodes")
    grid = InProcessGrid(0)
    for cid in range(3):
        grid.add_node(cid, 1000 + cid, {"client-id": cid, "data-dir": str(tmp_path / "nodes" / f"client_{cid}")})
    cfg = compose("dataset=local", "num_clients=3", "rounds=1", "method=fedavg", "local_epochs=1")
    assert cfg.run.alpha == 0.3
    summary = run_experiment(grid, cfg, check_partition=False)
    assert (summary["partition"], summary["alpha"], summary["partition_clients"]) == ("dirichlet", 1.0, 3)
    assert summary["node_dataset"] == "digits" and summary["data_source"] == "nodes"
    saved = json.loads((Path(summary["run_dir"]) / "summary.json").read_text())
    assert saved["alpha"] == 1.0
    (group,) = group_runs([Path(summary["run_dir"])])
    assert group.alpha == 1.0


def test_nodes_with_their_own_data_record_no_partition(tmp_path, compose):
    from pflower.server_app.runner import run_experiment
    from pflower.simulation.inprocess import InProcessGrid

    grid = InProcessGrid(0)
    for cid in range(2):
        write_local_dir(
            tmp_path / f"n{cid}",
            *(2 * [(np.zeros((8, 1, 16, 16), np.uint8) + cid, np.arange(8) % 2)]),
            name="mine",
            num_classes=10,
        )
        grid.add_node(cid, 1000 + cid, {"client-id": cid, "data-dir": str(tmp_path / f"n{cid}")})
    cfg = compose(
        "dataset=local", "dataset.options.image_size=16", "num_clients=2", "rounds=1", "method=fedavg", "local_epochs=1"
    )
    summary = run_experiment(grid, cfg, check_partition=False)
    assert (summary["partition"], summary["alpha"], summary["node_dataset"]) == ("node-local", None, "mine")
