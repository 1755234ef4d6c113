"""FedDyn: its defining behaviours (math on hand numbers; routing and state through the in-process grid)."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from method_helpers import ctx, role_args_of, trained_states
from test_strategy_base import make, run
from torch import nn

from pflower.client_app.roles import build_role
from pflower.client_app.roles.feddyn import PREFIX as DYN_PREFIX
from pflower.client_app.roles.feddyn import feddyn_loss, linear_term, updated_state
from pflower.client_app.roles.proximal import snapshot
from pflower.client_app.training import cross_entropy
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.feddyn import feddyn_server_update


# ----------------------------------------------------------------------------- FedDyn
def test_feddyn_server_update_on_hand_numbers():
    g, h = {"w": np.array([1.0], np.float32)}, {"w": np.zeros(1)}
    g1, h1 = feddyn_server_update(
        g, [{"w": np.array([2.0], np.float32)}, {"w": np.array([4.0], np.float32)}], h, 0.1, 4
    )
    # h = 0 - 0.1/4 * ((2 - 1) + (4 - 1)) = -0.1 ; global = mean 3 - h / 0.1 = 4
    assert h1["w"].tolist() == pytest.approx([-0.1]) and g1["w"].tolist() == pytest.approx([4.0])
    assert g1["w"].dtype == np.float32
    g2, h2 = feddyn_server_update(g1, [{"w": np.array([5.0], np.float32)}], h1, 0.1, 4)
    # h = -0.1 - 0.1/4 * (5 - 4) = -0.125 ; global = 5 + 1.25
    assert h2["w"].tolist() == pytest.approx([-0.125]) and g2["w"].tolist() == pytest.approx([6.25])


def test_feddyn_client_loss_and_state_update_on_hand_numbers(client):
    layer = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0]]))
    ref, g = {"weight": torch.tensor([[0.0, 1.0]])}, {"weight": torch.tensor([[0.5, -1.0]])}
    assert float(linear_term(layer, g).detach()) == pytest.approx(0.5 - 2.0)
    x, y = torch.ones(1, 2), torch.zeros(1, dtype=torch.long)
    with torch.no_grad():  # CE - <g, w> + alpha/2 ||w - ref||^2 = CE + 1.5 + 0.05 * 2
        assert float(feddyn_loss(ref, g, 0.1)(layer, x, y)) == pytest.approx(
            float(cross_entropy(layer, x, y)) + 1.5 + 0.1
        )
    new = updated_state(g, {"weight": torch.tensor([[1.0, 2.0]])}, ref, 0.1)  # g - 0.1 (w - ref)
    assert torch.allclose(new["weight"], torch.tensor([[0.4, -1.1]]))
    # the role keeps g on the client: from 0, g = -alpha (w_trained - w_received)
    model, data, args = client
    received, role_ctx = snapshot(model), ctx()
    build_role("feddyn", role_args_of("feddyn", alpha=0.01)).fit(model, data, replace(args, epochs=1), role_ctx)
    assert set(role_ctx.extra_state) == {DYN_PREFIX + k for k in received}
    for k, p in model.named_parameters():
        assert torch.allclose(role_ctx.extra_state[DYN_PREFIX + k], -0.01 * (p.detach() - received[k]), atol=1e-7)


def test_feddyn_round_trip_keeps_g_on_the_clients_and_h_on_the_server(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=feddyn", "fraction=1.0")
    before = copy.deepcopy(strategy.model.global_arrays)
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=1)
    assert not records[0]["dropped"] and records[0]["h_norm"] > 0
    replies = [r for r in grid.replies if r.metadata.message_type == "train"]
    uploads = [{k: v.numpy() for k, v in r.content.array_records["arrays"].items()} for r in replies]
    expected, _ = feddyn_server_update(before, uploads, {k: np.zeros(v.shape) for k, v in before.items()}, 0.01, 4)
    assert all(np.allclose(strategy.model.global_arrays[k], expected[k], atol=1e-6) for k in expected)
    assert all(any(k.startswith("extra." + DYN_PREFIX) for k in s) for s in trained_states(grid).values())
