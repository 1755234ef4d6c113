"""FedFomo: its defining behaviours (math on hand numbers; routing and state through the in-process grid)."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from method_helpers import ctx, replied_keys, role_args_of, train_messages
from test_strategy_base import make, run, sent_keys

from pflower.client_app.roles import build_role
from pflower.client_app.roles.fedfomo import fomo_combine, fomo_weights
from pflower.client_app.roles.proximal import snapshot
from pflower.simulation.inprocess import InProcessGrid


# ----------------------------------------------------------------------------- FedFomo
def test_fedfomo_weights_and_combination_on_hand_numbers():
    raw, w = fomo_weights(1.0, [0.5, 1.5, 0.8], [2.0, 1.0, 0.4])
    np.testing.assert_allclose(raw, [0.25, -0.5, 0.5], rtol=1e-4)  # (L_own - L_n) / ||theta_n - own||
    np.testing.assert_allclose(w, [1 / 3, 0.0, 2 / 3], rtol=1e-4)  # negatives -> 0, normalized
    assert fomo_weights(1.0, [1.2], [1.0])[1].tolist() == [0.0]  # nobody helps: own model kept
    own = {"x": torch.tensor([0.0, 0.0])}
    others = [{"x": torch.tensor([3.0, 3.0])}, {"x": torch.tensor([-4.0, 0.0])}, {"x": torch.tensor([0.0, 6.0])}]
    assert fomo_combine(own, others, w)["x"].tolist() == pytest.approx(
        [1.0, 5.0], rel=1e-4
    )  # own + sum w_n (theta_n - own)


def test_fedfomo_a_better_downloaded_model_gets_a_positive_weight_a_worse_one_zero(client):
    model, data, args = client
    better = copy.deepcopy(model)
    build_role("sgd", role_args_of("fedavg")).fit(better, data, replace(args, epochs=5), ctx())
    worse = copy.deepcopy(model)
    with torch.no_grad():
        for p in worse.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.5)
    role_ctx = ctx()
    role_ctx.received_extra = {f"{cid}/{k}": v for cid, m in ((7, better), (9, worse)) for k, v in snapshot(m).items()}
    metrics = build_role("fedfomo", role_args_of("fedfomo", val_ratio=0.2)).fit(
        model, data, replace(args, epochs=0), role_ctx
    )
    assert metrics["fomo_w_7"] > 0 > metrics["fomo_w_9"] and metrics["fomo_helpful"] == 1
    # weights [1, 0]: the new model is the better one (no training with 0 epochs)
    assert all(torch.allclose(p, dict(better.named_parameters())[k]) for k, p in model.named_parameters())


def test_fedfomo_downloads_other_clients_models_and_learns_affinities(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedfomo", "fraction=1.0", "method.m=2")
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=2)
    keys = set(strategy.model.global_arrays)
    assert all(not k for k in sent_keys(grid)[:4]) and records[0]["bytes_down"] == 0  # round 1: nothing stored yet
    for m in train_messages(grid, 2):
        cid = int(m.content["config"]["client-id"])
        names = {k.split("/")[1] for k in m.content.array_records["arrays"].keys()}
        assert len(names) == 2 and str(cid) not in names  # M = 2 others, never itself
        assert all(
            k.startswith("extra/") and k.split("/", 2)[2] in keys for k in m.content.array_records["arrays"].keys()
        )
    assert np.count_nonzero(strategy.affinity) == 8 and np.all(np.diag(strategy.affinity) == 0)
    assert all(keys == k for k in replied_keys(grid))
