"""FedPAC: the client's statistics, the combination matrix and the simplex quadratic program on
hand numbers; a round in-process (prototypes, statistics and classifiers up, each client's
combined classifier down)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from method_helpers import train_messages
from test_strategy_base import make

from pflower.client_app.roles.fedpac import HEAD, STATS, feature_statistics
from pflower.client_app.roles.fedproto import PROTO
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.fedpac import combination_matrix, combination_weights, simplex_quadratic_min


def test_the_statistics_on_hand_numbers():
    features = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    v, h = feature_statistics(features, torch.tensor([0, 0, 1]), 3)
    # p = (2/3, 1/3, 0); mu_0 = [2, 0], mu_1 = [0, 2]; (2/3 * 10/2 - 4/9 * 4 + 1/3 * 4 - 1/9 * 4) / 3
    assert v == pytest.approx(22 / 27)
    assert h.flatten().tolist() == pytest.approx([4 / 3, 0.0, 0.0, 2 / 3, 0.0, 0.0])


def test_the_combination_weights_on_hand_numbers():
    assert simplex_quadratic_min(np.diag([1.0, 3.0])) == pytest.approx([0.75, 0.25], abs=1e-6)  # a ~ 1 / p
    h = np.array([[[0.0]], [[1.0]]])  # one class, one feature: client 1 is 1 away from client 0
    assert combination_matrix(0, np.array([1.0, 1.0]), h).tolist() == [[1.0, 0.0], [0.0, 2.0]]
    assert combination_weights(0, np.array([1.0, 1.0]), h) == pytest.approx([2 / 3, 1 / 3], abs=1e-6)
    far = np.array([[[0.0]], [[100.0]]])  # a client far away gets a weight under 1e-3: dropped
    assert combination_weights(0, np.array([1.0, 1.0]), far).tolist() == [1.0, 0.0]


def test_a_round_combines_each_client_s_classifier(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedpac", "fraction=1.0")
    grid = InProcessGrid(4)
    heads_after = []  # the combined classifiers after each round
    strategy.start(grid, num_rounds=2, on_round=lambda _: heads_after.append(copy.deepcopy(strategy.heads)))
    head = list(strategy.head_keys)
    assert sorted(strategy.heads) == [0, 1, 2, 3] and strategy.known.any()
    sent = {}
    for m in train_messages(grid, 2):
        arrays = m.content.array_records["arrays"]
        keys = set(arrays.keys())
        assert {"extra/" + HEAD + k for k in head} <= keys and "extra/" + PROTO + "S" in keys
        assert not any(k.startswith("groups.classifier") for k in keys)  # the classifier is not FedAvg'd
        cid = int(grid.contexts[m.metadata.dst_node_id].node_config["partition-id"])
        sent[cid] = arrays["extra/" + HEAD + head[0]].numpy()
    # each client got the classifier the server combined for it after round 1, one of its own
    assert sorted(sent) == [0, 1, 2, 3] and len({a.tobytes() for a in sent.values()}) > 1
    for cid, array in sent.items():
        np.testing.assert_array_equal(array, heads_after[0][cid][head[0]])
    replies = [r for r in grid.replies if r.metadata.message_type == "train"]
    for r in replies:
        keys = set(r.content.array_records["arrays"].keys())
        assert {"extra/" + STATS + "v", "extra/" + STATS + "h", "extra/" + PROTO + "s"} <= keys
