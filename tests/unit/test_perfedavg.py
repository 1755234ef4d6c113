"""Per-FedAvg: the meta step (first-order and Hessian-free) and the adaptation step against
autograd by hand, the refusal of what is not plain SGD, the server's uniform average, a round."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from method_helpers import replied_keys
from test_strategy_base import make, run
from torch import nn

from pflower.client_app.roles.base import check_plain_sgd
from pflower.client_app.roles.perfedavg import adapted, meta_step
from pflower.client_app.training import TrainArgs
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.base.validation import ClientUpdate


def _setup():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    batches = [(torch.randn(4, 3), torch.tensor([0, 1, 1, 0])) for _ in range(3)]
    return model, batches


def _loss(weight, bias, batch):
    x, y = batch
    return nn.functional.cross_entropy(nn.functional.linear(x, weight, bias), y)


def _by_hand(model, batches, alpha, beta, hessian):
    """theta - beta * (I - alpha H(theta; D'')) grad f(theta - alpha grad f(theta; D); D'), exact."""
    w, b = (t.detach().clone().requires_grad_(True) for t in (model.weight, model.bias))
    gw, gb = torch.autograd.grad(_loss(w, b, batches[0]), [w, b])
    w1, b1 = (t.detach().clone().requires_grad_(True) for t in (w - alpha * gw, b - alpha * gb))
    ow, ob = torch.autograd.grad(_loss(w1, b1, batches[1]), [w1, b1])
    if hessian:  # the exact Hessian-vector product at theta on D''
        g = torch.autograd.grad(_loss(w, b, batches[2]), [w, b], create_graph=True)
        hw, hb = torch.autograd.grad((g[0] * ow).sum() + (g[1] * ob).sum(), [w, b])
        ow, ob = ow - alpha * hw, ob - alpha * hb
    return (w - beta * ow).detach(), (b - beta * ob).detach()


@pytest.mark.parametrize("hessian", [False, True])
def test_the_meta_step_is_maml_at_the_inner_step(hessian):
    model, batches = _setup()
    want_w, want_b = _by_hand(model, batches, 0.1, 0.05, hessian)
    meta_step(model, batches if hessian else batches[:2], 0.1, 0.05, delta=1e-3)
    # first order: exact; Hessian-free: the finite difference of width 1e-3 to 1e-5
    tol = 1e-5 if hessian else 1e-7
    assert torch.allclose(model.weight, want_w, atol=tol) and torch.allclose(model.bias, want_b, atol=tol)


def test_the_adaptation_is_one_gradient_step_on_a_copy():
    model, batches = _setup()
    before = copy.deepcopy(model)
    tuned = adapted(model, batches[:1], 0.1)
    gw, gb = torch.autograd.grad(_loss(model.weight, model.bias, batches[0]), [model.weight, model.bias])
    assert torch.allclose(tuned.weight, model.weight - 0.1 * gw) and torch.allclose(tuned.bias, model.bias - 0.1 * gb)
    assert torch.equal(model.weight, before.weight)  # the received model is left as it came


def test_anything_but_plain_sgd_is_refused_with_the_fix():
    check_plain_sgd(TrainArgs(), "perfedavg")
    for bad in (TrainArgs(optimizer="adam"), TrainArgs(momentum=0.9), TrainArgs(optimizer_state="kept")):
        with pytest.raises(ValueError, match="run it with optimizer=sgd, momentum=0"):
            check_plain_sgd(bad, "perfedavg")


@pytest.mark.parametrize(("weights", "expected"), [("uniform", 2.0), ("examples", 1.0 + 2.0 * 3 / 4)])
def test_the_server_averages_the_replies_uniformly_by_default(compose, tiny_overrides, weights, expected):
    _, strategy = make(compose, tiny_overrides, "method=perfedavg", f"method.weights={weights}")
    key = next(iter(strategy.model.global_arrays))
    shape = strategy.model.global_arrays[key].shape
    ups = [
        ClientUpdate(cid, cid, {key: np.full(shape, value, np.float32)}, n, {})
        for cid, value, n in ((0, 1.0, 10), (1, 3.0, 30))
    ]
    strategy.aggregate(1, ups)
    assert np.allclose(strategy.model.global_arrays[key], expected)


def test_a_round_sends_the_meta_trained_model(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=perfedavg", "fraction=1.0")
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=1)
    assert not records[0]["dropped"] and all(k == set(strategy.model.global_arrays) for k in replied_keys(grid))
