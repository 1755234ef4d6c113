"""FedAP: its defining behaviours (math on hand numbers; routing and state through the in-process grid)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from method_helpers import replied_keys
from test_strategy_base import make, run, sent_keys

from pflower.client_app.roles.fedap import bn_input_stats
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.fedap import bn_distance, fedap_weights


# ----------------------------------------------------------------------------- FedAP
def test_fedap_weights_and_model_momentum_on_hand_numbers(compose, tiny_overrides):
    a = {"bn_mean/0": np.array([0.0, 0.0]), "bn_var/0": np.array([1.0, 1.0])}
    b = {"bn_mean/0": np.array([3.0, 4.0]), "bn_var/0": np.array([1.0, 1.0])}
    c = {"bn_mean/0": np.array([0.0, 0.0]), "bn_var/0": np.array([4.0, 1.0])}  # sqrt(var) differs by 1
    assert bn_distance(a, b) == pytest.approx(5.0) and bn_distance(a, c) == pytest.approx(1.0)
    two = {**a, "bn_mean/1": np.array([1.0]), "bn_var/1": np.array([1.0])}
    assert bn_distance(two, {**c, "bn_mean/1": np.array([0.0]), "bn_var/1": np.array([1.0])}) == pytest.approx(
        2.0
    )  # sum over layers
    np.testing.assert_allclose(fedap_weights([5.0, 1.0], 0.5), [0.5, 0.5 / 6, 2.5 / 6])  # 1/d shares of 1 - mu
    np.testing.assert_allclose(fedap_weights([0.0, 2.0, 0.0], 0.5), [0.5, 0.25, 0.0, 0.25])
    assert fedap_weights([], 0.5).tolist() == [1.0]
    _, strategy = make(compose, tiny_overrides, "method=fedap", "method.warmup=0")
    keys = strategy.travelling_keys(strategy.model.groups, 0, 1)
    strategy.stats = {0: a, 1: b, 2: c}
    strategy.models = {
        j: {k: np.full(strategy.model.template[k][0], v, np.float32) for k in keys}
        for j, v in ((0, 6.0), (1, 12.0), (2, 0.0))
    }
    down = strategy.downlinks([0], 1)[0]  # 0.5 * own + 1/12 * theta_1 + 5/12 * theta_2 = 3 + 1 + 0
    assert set(down) == set(keys) and not set(down) & set(strategy.bn_keys)
    assert all(np.allclose(v, 4.0) for v in down.values())
    assert strategy.weights(3) == {3: 1.0}  # no statistics yet: its own (warm-up) model


def test_fedap_role_measures_the_input_statistics_of_each_bn_layer(client):
    model, data, _ = client
    stats = bn_input_stats(model, data.x_train, torch.device("cpu"), batch_size=7)
    with torch.no_grad():
        h = model.groups.conv1[0](data.x_train).double()  # conv1's BN input
    assert set(stats) == {"bn_mean/0", "bn_var/0", "bn_mean/1", "bn_var/1"} and stats["bn_mean/1"].shape == (16,)
    assert torch.allclose(stats["bn_mean/0"].double(), h.mean(dim=(0, 2, 3)), atol=1e-5)
    assert torch.allclose(stats["bn_var/0"].double(), h.var(dim=(0, 2, 3), unbiased=False), atol=1e-5)


def test_fedap_warmup_then_statistics_once_then_bn_similarity_weights(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedap", "method.warmup=1", "fraction=1.0")
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=3)
    assert [r["phase"] for r in records] == ["warmup", "personal", "personal"]
    travelling = set(strategy.model.global_arrays) - set(strategy.bn_keys)
    assert all(k == travelling for k in sent_keys(grid))  # BN parameters never travel
    ups = replied_keys(grid)
    stats = {f"extra/bn_{s}/{i}" for i in range(2) for s in ("mean", "var")}
    assert [k == travelling for k in ups[:4]] == [True] * 4 and all(k == travelling | stats for k in ups[4:8])
    assert all(k == travelling for k in ups[8:])  # statistics are uploaded once
    assert set(strategy.stats) == {0, 1, 2, 3} and records[2]["clients_with_stats"] == 4
    w = strategy.weights(0)
    assert w[0] == 0.5 and sum(w.values()) == pytest.approx(1.0) and len(w) == 4
