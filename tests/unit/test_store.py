"""Per-client server stores: in memory or on disk, and what a checkpoint keeps of them."""

from __future__ import annotations

import numpy as np
import pytest

from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.base.checkpoint import decode, encode
from pflower.strategies.base.store import ClientStore


def arrays(v: float) -> dict[str, np.ndarray]:
    return {"w": np.full((3, 2), v, np.float32), "b": np.full(2, -v, np.float32)}


@pytest.mark.parametrize("on_disk", [False, True])
def test_a_store_is_a_mapping_of_client_arrays(tmp_path, on_disk):
    store = ClientStore(tmp_path / "s" if on_disk else None)
    store[3], store[1] = arrays(1.0), arrays(2.0)
    store[3] = arrays(5.0)  # a new value replaces the old one
    assert list(store) == [1, 3] and len(store) == 2 and store.get(7) is None
    np.testing.assert_array_equal(store[3]["w"], arrays(5.0)["w"])
    assert list(store[1]) == ["w", "b"] and store.nbytes() == 2 * (24 + 8)
    assert store.keys_of(1) == ["w", "b"] and store.keys_of(7) == []  # without loading an array
    del store[1]
    assert list(store) == [3]
    if on_disk:
        assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["c3_v2"]  # superseded versions are gone


def test_a_checkpoint_names_the_disk_versions_and_a_resume_drops_what_came_after(tmp_path):
    store = ClientStore(tmp_path / "s")
    store[0], store[1] = arrays(1.0), arrays(2.0)
    saved: dict = {}
    tree = encode({"bodies": store}, saved)
    assert not saved  # no array is copied into the checkpoint: the folders are the data
    store[0] = arrays(9.0)  # after the checkpoint, then the server crashes
    store[2] = arrays(3.0)
    back = decode(tree, saved)["bodies"]
    assert list(back) == [0, 1]
    np.testing.assert_array_equal(back[0]["w"], arrays(1.0)["w"])  # the checkpointed version survived the update
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["c0_v0", "c1_v1"]
    back[0] = arrays(4.0)  # the pinned version stays until the next checkpoint names another
    assert {p.name for p in (tmp_path / "s").iterdir()} == {"c0_v0", "c0_v2", "c1_v1"}
    encode({"bodies": back}, {})  # the next checkpoint releases it
    assert {p.name for p in (tmp_path / "s").iterdir()} == {"c0_v2", "c1_v1"}
    np.testing.assert_array_equal(back[0]["w"], arrays(4.0)["w"])


def test_a_memory_store_checkpoints_its_arrays():
    store = ClientStore()
    store[5] = arrays(1.5)
    saved: dict = {}
    back = decode(encode({"s": store}, saved), saved)["s"]
    assert not back.on_disk and list(back) == [5]
    np.testing.assert_array_equal(back[5]["b"], arrays(1.5)["b"])


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_fedcpmd_runs_the_same_with_its_bodies_on_disk(compose, tiny_overrides):
    overrides = ["method=fedcpmd", "method.kp=2", "method.k_extra=0", "num_clients=6", "fraction=0.5", "rounds=4"]
    histories = []
    for mode in ("memory", "disk"):
        cfg = compose(*tiny_overrides, *overrides, f"server_store={mode}")
        from pflower.server_app.runner import run_experiment

        summary = run_experiment(InProcessGrid(6), cfg)
        histories.append(summary["headline_test_before_acc"])
        if mode == "disk":
            from pathlib import Path

            assert any((Path(summary["run_dir"]) / "server_store" / "bodies").iterdir())
    assert histories[0] == histories[1]
