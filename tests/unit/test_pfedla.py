"""pFedLA: its defining behaviours (math on hand numbers; routing and state through the in-process grid)."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord
from test_strategy_base import make, run

from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.pfedla import HyperNetwork, hypernet_step
from pflower.strategies.shared.aggregation import layerwise_mix as personalize


# ----------------------------------------------------------------------------- pFedLA
def test_pfedla_hypernetwork_rows_sum_to_one_and_its_update_approaches_the_trained_model():
    torch.manual_seed(0)
    hypernet = HyperNetwork(num_clients=3, num_layers=2, embedding_dim=4, hidden_dim=8)
    alpha = hypernet()
    assert alpha.shape == (2, 3) and torch.allclose(alpha.sum(dim=1), torch.ones(2)) and bool((alpha > 0).all())
    layer_keys = [["a"], ["b"]]
    models = [
        {"a": np.array([1.0, 0.0]), "b": np.array([0.0])},
        {"a": np.array([0.0, 1.0]), "b": np.array([1.0])},
        {"a": np.array([0.0, 0.0]), "b": np.array([4.0])},
    ]
    trained = {"a": np.array([0.9, 0.1]), "b": np.array([0.2])}  # close to client 0's model

    def gap() -> float:
        pers = personalize(models, hypernet().detach().numpy(), layer_keys)
        return float(sum(np.sum((pers[k] - trained[k]) ** 2) for k in trained))

    before, alpha0 = gap(), hypernet().detach()
    pers = hypernet_step(hypernet, models, trained, layer_keys, lr=0.05)
    assert np.allclose(
        pers["a"], alpha0[0].numpy() @ np.stack([m["a"] for m in models]), atol=1e-6
    )  # w~ it started from
    assert gap() < before
    alpha1 = hypernet().detach()
    assert alpha1[0, 0] > alpha0[0, 0] and alpha1[1, 2] < alpha0[1, 2]  # toward client 0, away from the far one


def test_pfedla_personalizes_layer_by_layer_and_updates_the_participants_hypernetworks(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=pfedla", "fraction=1.0")
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=1)
    assert not records[0]["dropped"] and set(strategy.hypernets) == set(strategy.models) == {0, 1, 2, 3}
    for m in strategy.configure_train(2, ArrayRecord(), ConfigRecord(), grid):
        cid = strategy.ledger.inflight[m.metadata.dst_node_id]
        alpha = strategy.alpha(cid)
        assert alpha.shape == (5, 4) and np.allclose(alpha.sum(axis=1), 1.0)
        k = "groups.fc2.0.weight"  # fc2 is group 3
        expected = sum(alpha[3, j] * strategy.models[j][k].astype(np.float64) for j in range(4))
        np.testing.assert_allclose(m.content.array_records["arrays"][k].numpy(), expected, rtol=1e-5, atol=1e-7)
