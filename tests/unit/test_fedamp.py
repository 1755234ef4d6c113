"""FedAMP: its defining behaviours (math on hand numbers; routing and state through the in-process grid)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from method_helpers import ctx, replied_keys, role_args_of, trained_states
from test_strategy_base import make, run, sent_keys

from pflower.client_app.roles import build_role
from pflower.client_app.roles.proximal import proximal_loss
from pflower.client_app.training import cross_entropy
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.fedamp import attention_matrix
from pflower.strategies.shared.aggregation import weighted_average
from pflower.strategies.shared.model_distance import gram_matrix


# ----------------------------------------------------------------------------- FedAMP
def test_fedamp_attention_rows_sum_to_one_and_closer_models_weigh_more():
    models = [{"w": np.array([0.0, 0.0])}, {"w": np.array([1.0, 0.0])}, {"w": np.array([3.0, 0.0])}]
    gram = gram_matrix(models, ["w"])
    xi = attention_matrix(gram, self_weight=0.5, sigma=2.0, kernel="distance")
    np.testing.assert_allclose(xi.sum(axis=1), 1.0)
    np.testing.assert_allclose(np.diag(xi), 0.5)
    # client 0: squared distances 1 and 9 -> 0.5 * softmax(-1/2, -9/2)
    e1, e9 = math.exp(-0.5), math.exp(-4.5)
    np.testing.assert_allclose(xi[0], [0.5, 0.5 * e1 / (e1 + e9), 0.5 * e9 / (e1 + e9)])
    assert xi[1, 0] > xi[1, 2] and xi[2, 1] > xi[2, 0]  # closer models get larger weights
    far = attention_matrix(1e6 * gram, self_weight=0.2, sigma=1.0)  # no underflow to an empty row
    np.testing.assert_allclose(far.sum(axis=1), 1.0) and np.testing.assert_allclose(far[0], [0.2, 0.8, 0.0])
    cos = attention_matrix(
        gram_matrix([{"w": np.array(v)} for v in ([1.0, 0.0], [1.0, 1.0], [-1.0, 0.0])], ["w"]), 0.5, 1.0, "cosine"
    )
    s = np.exp([1 / math.sqrt(2), -1.0])
    np.testing.assert_allclose(cos[0], [0.5, *(0.5 * s / s.sum())])


def test_fedamp_client_loss_includes_the_pull_toward_the_cloud_model(client):
    model, data, args = client
    noise = torch.Generator().manual_seed(1)
    cloud = {k: v.detach() + 0.01 * torch.randn(v.shape, generator=noise) for k, v in model.named_parameters()}
    role_ctx = ctx()
    role_ctx.received_extra = {f"u/{k}": v for k, v in cloud.items()}
    role = build_role("fedamp", role_args_of("fedamp", lam=2.0))
    reference = role.reference(model, role_ctx)
    assert set(reference) == set(cloud) and all(torch.equal(reference[k], cloud[k]) for k in cloud)
    x, y = data.x_train[:8], data.y_train[:8]
    with torch.no_grad():  # lam/2 * ||w - u||^2 with lam = 2
        extra = float(proximal_loss(reference, 2.0)(model, x, y) - cross_entropy(model, x, y))
        assert extra == pytest.approx(
            sum(float(((p - cloud[k]) ** 2).sum()) for k, p in model.named_parameters()), rel=1e-4
        )
    moved = {}
    for lam in (0.0, 10.0):
        m, c = copy.deepcopy(model), ctx()
        c.received_extra = role_ctx.received_extra
        build_role("fedamp", role_args_of("fedamp", lam=lam)).fit(m, data, args, c)
        moved[lam] = sum(float(((p.detach() - cloud[k]) ** 2).sum()) for k, p in m.named_parameters())
    assert moved[10.0] < 0.1 * moved[0.0]  # a large lam keeps w near u


def test_fedamp_sends_each_client_its_cloud_model_and_keeps_models_on_the_clients(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedamp", "fraction=1.0")
    grid = InProcessGrid(4)
    run(strategy, grid, rounds=1)
    keys = set(strategy.model.global_arrays)
    assert all(k == {"extra/u/" + x for x in keys} for k in sent_keys(grid))  # only u_i travels down
    assert all(k == keys for k in replied_keys(grid)) and set(strategy.models) == {0, 1, 2, 3}
    states = trained_states(grid)
    for cid, w in strategy.models.items():  # the personal model stays on the client too
        assert all(np.array_equal(states[cid][k], w[k]) for k in keys)
    messages = list(strategy.configure_train(2, ArrayRecord(), ConfigRecord(), grid))
    k = "groups.fc1.0.weight"
    for m in messages:
        cid = strategy.ledger.inflight[m.metadata.dst_node_id]
        models, row = strategy.cloud_weights(cid)
        assert len(row) == 4 and row[0] == 0.5 and row.sum() == pytest.approx(1.0)
        expected = weighted_average(models, row, keys=[k])[k]
        np.testing.assert_allclose(
            m.content.array_records["arrays"]["extra/u/" + k].numpy(), expected, rtol=1e-5, atol=1e-7
        )
