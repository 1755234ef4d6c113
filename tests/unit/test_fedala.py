"""FedALA: the element-wise mix, the weights' step and the convergence rule on hand numbers; the
adaptive aggregation on a client (lower groups global, the top group mixed, the weights kept);
a round in-process."""

from __future__ import annotations

import pytest
import torch
from method_helpers import ctx, replied_keys, role_args_of
from test_strategy_base import make, run

from pflower.client_app.roles import build_role
from pflower.client_app.roles.fedala import LOCAL, STARTED, WEIGHTS, converged, mixed, weight_step
from pflower.simulation.inprocess import InProcessGrid, personal_state


def test_the_mix_the_weights_step_and_convergence_on_hand_numbers():
    local, global_ = torch.tensor([1.0, 1.0]), torch.tensor([3.0, 5.0])
    assert mixed(local, global_, torch.tensor([0.5, 0.25])).tolist() == [2.0, 2.0]
    # W - eta * grad * (global - local): 0.5 - 1 * 0.1 * 2 = 0.3; 1 - 1 * (-1) * 4 = 5 -> clipped to 1
    assert weight_step(
        torch.tensor([0.5, 1.0]), torch.tensor([0.1, -1.0]), local, global_, 1.0
    ).tolist() == pytest.approx([0.3, 1.0])
    assert not converged([1.0, 1.0], window=2, threshold=0.1)  # needs more than the window
    assert converged([5.0, 1.0, 1.02, 0.98], window=3, threshold=0.1)
    assert not converged([5.0, 1.0, 1.5, 0.5], window=3, threshold=0.1)


def test_the_client_keeps_lower_groups_global_and_mixes_its_top_group(client):
    model, data, args = client
    role_ctx = ctx()
    role = build_role("fedala", role_args_of("fedala"))
    assert (
        role.eval_model(model, data, args, role_ctx) is model and STARTED not in role_ctx.extra_state
    )  # first contact
    role.fit(model, data, args, role_ctx)
    local = {k[len(LOCAL) :]: v for k, v in role_ctx.extra_state.items() if k.startswith(LOCAL)}
    assert set(local) == set(model.state_dict())
    # the next round: a global model other than the local one arrives
    received = {k: v + 0.5 for k, v in local.items()}
    model.load_state_dict(received)
    next_role = build_role("fedala", role_args_of("fedala"))
    adapted = next_role.eval_model(model, data, args, role_ctx)
    top = [k for k in received if k.startswith("groups.classifier.")]
    body = [
        k for k in received if not k.startswith("groups.classifier.") and "running" not in k and "num_batches" not in k
    ]
    state = adapted.state_dict()
    assert all(torch.equal(state[k], received[k]) for k in body)  # lower groups: the global values
    weights = {k: role_ctx.extra_state[WEIGHTS + k] for k in top if WEIGHTS + k in role_ctx.extra_state}
    assert set(weights) == {k for k in top if k in dict(model.named_parameters())}
    for k, w in weights.items():  # the top group: local + (global - local) * W, W learned in [0, 1]
        assert torch.allclose(state[k], local[k] + (received[k] - local[k]) * w, atol=1e-6)
        assert 0.0 <= float(w.min()) and float(w.max()) <= 1.0
    assert any(float(w.min()) < 1.0 for w in weights.values())  # W moved from its start at ones
    assert STARTED in role_ctx.extra_state


def test_a_round_sends_the_model_and_keeps_the_local_one(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedala", "fraction=1.0")
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=2)
    assert not any(r["dropped"] for r in records) and all(
        k == set(strategy.model.global_arrays) for k in replied_keys(grid)
    )
    for c in grid.contexts.values():
        state = personal_state(c)
        assert "extra." + STARTED in state  # the second round adapted
        assert any(k.startswith("extra." + WEIGHTS) for k in state)
