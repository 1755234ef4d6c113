"""CFL: its defining behaviours (math on hand numbers; routing and state through the in-process grid)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord
from sklearn.cluster import AgglomerativeClustering
from test_strategy_base import make, run

import pflower.client_app.runtime as runtime
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.shared.clustering import bipartition


# ----------------------------------------------------------------------------- CFL
def test_bipartition_separates_a_hand_made_similarity_matrix_and_matches_the_reference():
    s = np.array(
        [
            [1.0, 0.8, 0.7, -0.2, -0.4],
            [0.8, 1.0, 0.6, -0.1, -0.3],
            [0.7, 0.6, 1.0, 0.1, -0.5],
            [-0.2, -0.1, 0.1, 1.0, 0.9],
            [-0.4, -0.3, -0.5, 0.9, 1.0],
        ]
    )
    assert bipartition(s) == ([0, 1, 2], [3, 4])
    assert bipartition(s[::-1, ::-1]) == ([0, 1], [2, 3, 4])  # item 0's cluster first
    rng = np.random.default_rng(0)  # the reference code's complete-linkage clustering (scikit-learn)
    for _ in range(40):
        v = rng.standard_normal((int(rng.integers(2, 10)), 4))
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        labels = (
            AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete").fit(1 - v @ v.T).labels_
        )
        first = sorted(np.flatnonzero(labels == labels[0]).tolist())
        assert bipartition(v @ v.T)[0] == first


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_cfl_splits_clients_with_swapped_labels_from_the_others(compose, tiny_overrides, monkeypatch):
    original = runtime.client_data

    def swapped(spec, cid, *args, **kwargs):  # clients 2 and 3 see y -> 9 - y
        data = original(spec, cid, *args, **kwargs)
        return dataclasses.replace(data, y_train=9 - data.y_train, y_test=9 - data.y_test) if cid >= 2 else data

    monkeypatch.setattr(runtime, "client_data", swapped)
    iid = [o for o in tiny_overrides if not o.startswith("partition.")] + ["partition=iid"]
    _, strategy = make(
        compose,
        iid,
        "method=cfl",
        "fraction=1.0",
        "local_epochs=2",
        "method.start_round=2",
        "method.eps1=100",
        "method.eps2=0",
    )
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=2)
    assert [r["clusters"] for r in records] == [[[0, 1, 2, 3]], [[0, 1], [2, 3]]]
    assert records[1]["splits"] == 1 and strategy.sim[0, 1] > max(strategy.sim[0, 2:].max(), strategy.sim[1, 2:].max())
    messages = list(strategy.configure_train(3, ArrayRecord(), ConfigRecord(), grid))
    k = "groups.classifier.weight"
    sent = {
        strategy.ledger.inflight[m.metadata.dst_node_id]: m.content.array_records["arrays"][k].numpy() for m in messages
    }
    assert (
        np.array_equal(sent[0], sent[1]) and np.array_equal(sent[2], sent[3]) and not np.array_equal(sent[0], sent[2])
    )
    np.testing.assert_array_equal(sent[2], strategy.clusters.models[1][k])


def test_cfl_does_not_split_before_its_thresholds_say_so(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=cfl", "fraction=1.0", "method.start_round=1")
    records = run(strategy, InProcessGrid(4), rounds=1)  # eps2 = 1.6: one epoch moves far less
    assert records[0]["clusters"] == [[0, 1, 2, 3]] and records[0]["max_update_norm"] < 1.6


def test_cfl_rescales_update_norms_to_the_base_learning_rate(compose, tiny_overrides):
    """Under lr x0.5 a round, round 2's logged norms are the raw ones times 2 (lr_normalized,
    the default); with lr_normalized=false they are the raw ones. Same seed, same training."""
    decay = ["method=cfl", "fraction=1.0", "+lr_schedule={kind: exponential, gamma: 0.5}", "method.start_round=1000"]
    _, scaled = make(compose, tiny_overrides, *decay)
    _, raw = make(compose, tiny_overrides, *decay, "method.lr_normalized=false")
    a, b = run(scaled, InProcessGrid(4), rounds=2), run(raw, InProcessGrid(4), rounds=2)
    assert a[0]["max_update_norm"] == b[0]["max_update_norm"]
    np.testing.assert_allclose(a[1]["max_update_norm"], 2 * b[1]["max_update_norm"], rtol=1e-12)
    np.testing.assert_allclose(a[1]["mean_update_norm"], 2 * b[1]["mean_update_norm"], rtol=1e-12)
    assert -1 <= a[1]["cross_cos_max"] <= 1


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_cfl_recovers_the_label_groups_of_a_two_classes_per_client_split(tmp_path):
    """benchmarks/cfl_split: 12 digits clients, 2 classes each, 3 label groups. eps2 set by the
    rule the method docs give (1.25 x the largest update of the same clients sharing one
    distribution) splits twice and ends with exactly the label groups (ARI 1); the reference
    code's eps2 = 1.6 never splits at this scale."""
    import sys
    from pathlib import Path

    from sklearn.metrics import adjusted_rand_score

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ is a folder of the checkout
    from benchmarks.cfl_split import CLIENTS, calibrated_eps2, cluster_labels, run_cfl, write_label_group_federation

    truth = write_label_group_federation(tmp_path / "groups")
    write_label_group_federation(tmp_path / "one", groups=False)
    short = ["rounds=10"]
    _, one = run_cfl(tmp_path / "one", tmp_path / "out", [*short, "method.start_round=1000"])
    eps2 = calibrated_eps2(one, start_round=5)
    summary, rounds = run_cfl(tmp_path / "groups", tmp_path / "out", [*short, f"method.eps2={eps2}"])
    assert len(summary["split_rounds"]) == 2 and summary["num_clusters"] == 3, summary["split_rounds"]
    assert adjusted_rand_score(truth, cluster_labels(summary["clusters"], CLIENTS)) == 1.0
    assert max(r["max_update_norm"] for r in rounds) > eps2 > max(r["max_update_norm"] for r in one if r["round"] >= 5)
