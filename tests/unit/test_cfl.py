"""CFL: its defining behaviours (math on hand numbers; routing and state through the in-process grid)."""

from __future__ import annotations

import dataclasses

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from sklearn.cluster import AgglomerativeClustering
from test_strategy_base import make, run

import client_app.runtime as runtime
from server_app.inprocess import InProcessGrid
from strategies.clustering import bipartition


# ----------------------------------------------------------------------------- CFL
def test_bipartition_separates_a_hand_made_similarity_matrix_and_matches_the_reference():
    s = np.array([
        [1.0, 0.8, 0.7, -0.2, -0.4],
        [0.8, 1.0, 0.6, -0.1, -0.3],
        [0.7, 0.6, 1.0, 0.1, -0.5],
        [-0.2, -0.1, 0.1, 1.0, 0.9],
        [-0.4, -0.3, -0.5, 0.9, 1.0],
    ])
    assert bipartition(s) == ([0, 1, 2], [3, 4])
    assert bipartition(s[::-1, ::-1]) == ([0, 1], [2, 3, 4])  # item 0's cluster first
    rng = np.random.default_rng(0)  # the reference code's complete-linkage clustering (scikit-learn)
    for _ in range(40):
        v = rng.standard_normal((int(rng.integers(2, 10)), 4))
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        labels = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete").fit(1 - v @ v.T).labels_
        first = sorted(np.flatnonzero(labels == labels[0]).tolist())
        assert bipartition(v @ v.T)[0] == first


def test_cfl_splits_clients_with_swapped_labels_from_the_others(compose, tiny_overrides, monkeypatch):
    original = runtime.client_data

    def swapped(spec, cid, *args, **kwargs):  # clients 2 and 3 see y -> 9 - y
        data = original(spec, cid, *args, **kwargs)
        return dataclasses.replace(data, y_train=9 - data.y_train, y_test=9 - data.y_test) if cid >= 2 else data

    monkeypatch.setattr(runtime, "client_data", swapped)
    iid = [o for o in tiny_overrides if not o.startswith("partition.")] + ["partition=iid"]
    _, strategy = make(
        compose, iid, "method=cfl", "fraction=1.0", "local_epochs=2",
        "method.start_round=2", "method.eps1=100", "method.eps2=0",
    )
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=2)
    assert [r["clusters"] for r in records] == [[[0, 1, 2, 3]], [[0, 1], [2, 3]]]
    assert records[1]["splits"] == 1 and strategy.sim[0, 1] > max(strategy.sim[0, 2:].max(), strategy.sim[1, 2:].max())
    messages = list(strategy.configure_train(3, ArrayRecord(), ConfigRecord(), grid))
    k = "groups.classifier.weight"
    sent = {strategy._inflight[m.metadata.dst_node_id]: m.content.array_records["arrays"][k].numpy() for m in messages}
    assert np.array_equal(sent[0], sent[1]) and np.array_equal(sent[2], sent[3]) and not np.array_equal(sent[0], sent[2])
    np.testing.assert_array_equal(sent[2], strategy.clusters.models[1][k])


def test_cfl_does_not_split_before_its_thresholds_say_so(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=cfl", "fraction=1.0", "method.start_round=1")
    records = run(strategy, InProcessGrid(4), rounds=1)  # eps2 = 1.6: one epoch moves far less
    assert records[0]["clusters"] == [[0, 1, 2, 3]] and records[0]["max_update_norm"] < 1.6

