"""APFL: the mix and alpha's step on hand-worked numbers, the paper's simultaneous updates
(w's step is FedAvg's own; v's and alpha's are the gradients of f at the mix), and v and alpha
kept on the client and never sent (the in-process grid)."""

from __future__ import annotations

import copy

import pytest
import torch
from method_helpers import ctx, replied_keys, role_args_of
from test_strategy_base import make, run
from torch import nn

from pflower.client_app.roles import build_role
from pflower.client_app.roles.apfl import ALPHA, PREFIX, alpha_step, mixed_parameters
from pflower.client_app.training import TrainArgs
from pflower.federated_data import ClientData
from pflower.simulation.inprocess import InProcessGrid, personal_state


def test_the_mix_and_alphas_step_on_hand_numbers():
    mix = mixed_parameters({"a": torch.tensor([2.0])}, {"a": torch.tensor([4.0])}, torch.tensor(0.25))
    assert mix["a"].item() == 3.5  # 0.25 * 2 + 0.75 * 4
    assert alpha_step(torch.tensor(0.5), torch.tensor(1.0), 0.1, 0.0).item() == pytest.approx(0.4)
    assert alpha_step(torch.tensor(0.5), torch.tensor(1.0), 0.1, 0.02).item() == pytest.approx(
        0.399
    )  # 0.5 - 0.1 * 1.01
    assert alpha_step(torch.tensor(0.05), torch.tensor(1.0), 0.1, 0.0).item() == 0.0  # clipped to [0, 1]
    assert alpha_step(torch.tensor(0.95), torch.tensor(-1.0), 0.1, 0.0).item() == 1.0


def _one_batch(seed: int = 0):
    torch.manual_seed(seed)
    w = nn.Sequential(nn.Linear(3, 2))
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    data = ClientData(client_id=0, x_train=x, y_train=y, x_test=x, y_test=y, num_classes=2)
    return w, data


def test_one_step_is_the_papers_simultaneous_update():
    """One batch of 4 (batch size 4, one epoch): w moves by -lr * grad f(w), as plain SGD; v by
    -lr * alpha * grad f(v_bar); alpha by -lr * <v - w, grad f(v_bar)>, all at the values before."""
    w, data = _one_batch()
    role_ctx = ctx()
    v0 = copy.deepcopy(w)
    with torch.no_grad():  # a personal model apart from w, as after some rounds
        v0[0].weight.add_(0.3)
    role_ctx.extra_state.update({PREFIX + k: t.clone() for k, t in v0.state_dict().items()})
    role_ctx.extra_state[ALPHA] = torch.tensor(0.5)
    w_before = copy.deepcopy(w)
    args = TrainArgs(epochs=1, batch_size=4, lr=0.1)
    role = build_role("apfl", role_args_of("apfl"))
    metrics = role.fit(w, data, args, role_ctx)
    # by hand, with autograd: f(w), and f at v_bar = 0.5 v + 0.5 w
    xb, yb = data.x_train, data.y_train
    (gw,) = torch.autograd.grad(nn.functional.cross_entropy(w_before(xb), yb), [w_before[0].weight])
    bar = {k: 0.5 * v0.state_dict()[k] + 0.5 * w_before.state_dict()[k] for k in v0.state_dict()}
    weight = bar["0.weight"].clone().requires_grad_(True)
    loss_bar = nn.functional.cross_entropy(nn.functional.linear(xb, weight, bar["0.bias"]), yb)
    (gbar,) = torch.autograd.grad(loss_bar, [weight])
    assert torch.allclose(w[0].weight, w_before[0].weight - 0.1 * gw, atol=1e-6)
    v_after = role_ctx.extra_state[PREFIX + "0.weight"]
    assert torch.allclose(v_after, v0[0].weight - 0.1 * 0.5 * gbar, atol=1e-6)
    bias = torch.autograd.grad(
        nn.functional.cross_entropy(nn.functional.linear(xb, bar["0.weight"], bar["0.bias"].requires_grad_(True)), yb),
        [bar["0.bias"]],
    )[0]
    grad_alpha = ((v0[0].weight - w_before[0].weight) * gbar).sum() + ((v0[0].bias - w_before[0].bias) * bias).sum()
    assert metrics["alpha"] == pytest.approx(float(0.5 - 0.1 * grad_alpha.detach()), abs=1e-6)
    assert role_ctx.extra_state[ALPHA].item() == pytest.approx(metrics["alpha"])


def test_alpha_stays_where_it_is_unless_adaptive():
    w, data = _one_batch(1)
    role_ctx = ctx()
    role = build_role("apfl", role_args_of("apfl", adaptive_alpha=False, alpha=0.3))
    assert role.fit(w, data, TrainArgs(epochs=2, batch_size=2, lr=0.1), role_ctx)["alpha"] == pytest.approx(0.3)


def test_a_round_keeps_v_and_alpha_on_each_node_and_sends_only_w(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=apfl", "fraction=1.0")
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=1)
    assert not records[0]["dropped"] and all(k == set(strategy.model.global_arrays) for k in replied_keys(grid))
    for c in grid.contexts.values():
        state = personal_state(c)
        assert 0.0 <= float(state["extra." + ALPHA]) <= 1.0 and float(state["extra." + ALPHA]) != 0.5  # learned
        assert (
            state["extra.apfl.v.groups.fc1.0.weight"].shape == strategy.model.global_arrays["groups.fc1.0.weight"].shape
        )
