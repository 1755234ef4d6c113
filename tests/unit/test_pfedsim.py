"""pFedSim: its defining behaviours (math on hand numbers; routing and state through the in-process grid)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord
from method_helpers import BODY, HEAD, replied_keys
from test_strategy_base import make, run, sent_keys

from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.pfedsim import classifier_similarity, pfedsim_weights
from pflower.strategies.shared.aggregation import mixing_average


# ----------------------------------------------------------------------------- pFedSim
def test_pfedsim_similarity_and_weights_by_hand():
    eye = np.eye(2, dtype=np.float32)
    classifiers = [
        {"w": eye, "b": np.zeros(2, np.float32)},
        {"w": np.array([[2.0, 0.0], [3.0, 0.0]], np.float32), "b": np.ones(2, np.float32)},  # row cosines 1, 0
        {"w": -eye, "b": np.zeros(2, np.float32)},  # row cosines with client 0: -1, -1
    ]
    s = classifier_similarity(classifiers, ["w", "b"])  # the bias is left out
    np.testing.assert_allclose(s, [[1, 0.5, 0], [0.5, 1, 0], [0, 0, 1]], atol=1e-6)
    np.testing.assert_allclose(pfedsim_weights(s[0], 0, "linear"), [2 / 3, 1 / 3, 0])
    expected = np.array([-np.log(1e-4), np.log(2), 0])  # -log(1 - S), S_ii = 0.9999
    np.testing.assert_allclose(pfedsim_weights(s[0], 0, "pfedsim"), expected / expected.sum())
    np.testing.assert_allclose(pfedsim_weights(np.ones(3), 1, "pfedsim"), [1 / 3] * 3)  # S = 1 stays finite
    bodies = [{"x": np.array([v], np.float32)} for v in (0.0, 3.0, 6.0)]
    mixed = mixing_average(bodies, np.stack([pfedsim_weights(s[i], i, "linear") for i in range(3)]))
    assert [float(m["x"][0]) for m in mixed] == pytest.approx([1.0, 2.0, 6.0])


def test_pfedsim_warmup_sends_everything_then_classifier_stays_and_bodies_differ(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=pfedsim", "method.warmup=1", "fraction=1.0")
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=2)
    everything, head, body = (
        set(strategy.model.global_arrays),
        set(strategy.model.keys(HEAD)),
        set(strategy.model.keys(BODY)),
    )
    assert head | body == everything and not head & body  # the classifier and the body split the model
    down = sent_keys(grid)
    assert [r["phase"] for r in records] == ["warmup", "personal"]
    assert all(keys == everything for keys in down[:4])  # round 1 (warm-up): FedAvg of everything
    assert all(keys == everything for keys in down[4:])  # round 2: body + the warm-up classifier, once
    assert all(keys == everything for keys in replied_keys(grid))  # classifiers go up, for S only
    assert np.all(strategy.sim[~np.eye(4, dtype=bool)] > 0) and strategy.head_seen == {0, 1, 2, 3}
    messages = list(strategy.configure_train(3, ArrayRecord(), ConfigRecord(), grid))
    bodies = {}
    for m in messages:
        arrays = m.content.array_records["arrays"]
        assert set(arrays.keys()) == body  # the classifier is never sent again
        cid = strategy.ledger.inflight[m.metadata.dst_node_id]
        bodies[cid] = {k: arrays[k].numpy() for k in body}
        weights = strategy.body_weights(cid)
        assert len(weights) == 4 and weights[cid] == max(weights.values())
        expected = sum(w * strategy.bodies[j]["groups.fc1.0.weight"].astype(np.float64) for j, w in weights.items())
        np.testing.assert_allclose(bodies[cid]["groups.fc1.0.weight"], expected, rtol=1e-5, atol=1e-6)
    assert len({tuple(strategy.sim[c].round(6)) for c in bodies}) == 4  # rows of S differ...
    k = "groups.fc1.0.weight"
    assert all(
        not np.array_equal(bodies[a][k], bodies[b][k]) for a in bodies for b in bodies if a < b
    )  # ...so do bodies
