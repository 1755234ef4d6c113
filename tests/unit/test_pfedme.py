"""pFedMe: the personalized and local steps and the server's beta on hand-worked numbers, one
batch of the client's loop against its closed form, and a round (w sent, theta kept)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from method_helpers import ctx, replied_keys, role_args_of
from test_strategy_base import make, run
from torch import nn

from pflower.client_app.roles import build_role
from pflower.client_app.roles.pfedme import PREFIX, local_step, personal_step
from pflower.client_app.training import TrainArgs
from pflower.federated_data import ClientData
from pflower.simulation.inprocess import InProcessGrid, personal_state
from pflower.strategies.pfedme import mix_in


def test_the_steps_and_the_servers_mix_on_hand_numbers():
    theta, w = [torch.tensor([2.0])], [torch.tensor([1.0])]
    personal_step(theta, [torch.tensor([0.5])], w, lr=0.1, lam=15.0, mu=0.0)
    assert theta[0].item() == pytest.approx(2.0 - 0.1 * (0.5 + 15 * 1.0))  # 0.45
    personal_step(theta, [torch.tensor([0.0])], w, lr=0.1, lam=0.0, mu=0.5)
    assert theta[0].item() == pytest.approx(0.45 * (1 - 0.05))
    local_step(w, [torch.tensor([0.0])], lr=0.01, lam=15.0)
    assert w[0].item() == pytest.approx(1.0 - 0.01 * 15 * 1.0)  # 0.85
    mixed = mix_in({"a": np.array([1.0], np.float32)}, {"a": np.array([3.0], np.float32)}, beta=2.0)
    assert mixed["a"].tolist() == [5.0] and mixed["a"].dtype == np.float32  # -1 * 1 + 2 * 3


def test_one_batch_with_one_personal_step_is_its_closed_form():
    """theta starts at w, so its first step is the plain gradient; then w moves lr * lam of the way."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2))
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    data = ClientData(client_id=0, x_train=x, y_train=y, x_test=x, y_test=y, num_classes=2)
    received = copy.deepcopy(model)
    (g,) = torch.autograd.grad(nn.functional.cross_entropy(received(x), y), [received[0].weight])
    role_ctx = ctx()
    role = build_role("pfedme", role_args_of("pfedme", k=1, personal_lr=0.05, lam=2.0))
    role.fit(model, data, TrainArgs(epochs=1, batch_size=4, lr=0.1), role_ctx)
    theta = received[0].weight - 0.05 * g
    assert torch.allclose(role_ctx.extra_state[PREFIX + "0.weight"], theta, atol=1e-6)
    assert torch.allclose(model[0].weight, received[0].weight - 0.1 * 2.0 * (received[0].weight - theta), atol=1e-6)
    assert torch.allclose(role.trained_model(model, role_ctx)[0].weight, theta, atol=1e-6)  # test_after: theta


def test_a_round_sends_w_and_keeps_theta_on_each_node(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=pfedme", "fraction=1.0", "method.k=2")
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=1)
    assert not records[0]["dropped"] and all(k == set(strategy.model.global_arrays) for k in replied_keys(grid))
    key = "groups.fc1.0.weight"
    for c in grid.contexts.values():
        theta = personal_state(c)["extra." + PREFIX + key]
        assert theta.shape == strategy.model.global_arrays[key].shape
        assert not np.array_equal(theta, strategy.model.global_arrays[key])  # personal, not the global
