"""FedProx: its defining behaviours (math on hand numbers; routing and state through the in-process grid)."""

from __future__ import annotations

import copy

import pytest
import torch
from method_helpers import ctx, role_args_of
from test_strategy_base import make
from torch import nn

from pflower.client_app.roles import build_role
from pflower.client_app.roles.proximal import proximal_loss, proximal_term, snapshot


# ----------------------------------------------------------------------------- FedProx
def test_proximal_term_is_half_mu_squared_distance_on_a_hand_case():
    layer = nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0]]))
        layer.bias.copy_(torch.tensor([3.0]))
    ref = {"weight": torch.zeros(1, 2), "bias": torch.tensor([1.0])}
    term = proximal_term(layer, ref, mu=0.5)  # 0.5/2 * (1 + 4 + 4)
    assert float(term.detach()) == pytest.approx(2.25)
    term.backward()  # gradient mu * (w - ref)
    assert torch.allclose(layer.weight.grad, torch.tensor([[0.5, 1.0]])) and torch.allclose(
        layer.bias.grad, torch.tensor([1.0])
    )
    # the loss adds it to cross-entropy; mu = 0 is cross-entropy itself
    x, y = torch.ones(3, 2), torch.zeros(3, dtype=torch.long)
    base = lambda m, xb, yb: m(xb).sum()  # noqa: E731
    with torch.no_grad():
        assert float(proximal_loss(ref, 0.5, base)(layer, x, y)) == pytest.approx(float(layer(x).sum()) + 2.25)
    assert proximal_loss(ref, 0.0, base) is base


def test_fedprox_large_mu_keeps_local_weights_closer_to_the_global(client):
    model, data, args = client
    start = snapshot(model)
    moved = {}
    for mu in (0.0, 10.0):
        m = copy.deepcopy(model)
        build_role("proximal", role_args_of("fedprox", mu=mu)).fit(m, data, args, ctx())
        moved[mu] = sum(float(((p.detach() - start[k]) ** 2).sum()) for k, p in m.named_parameters()) ** 0.5
    assert 0 < moved[10.0] < 0.8 * moved[0.0]


def test_fedprox_sends_mu_to_the_proximal_role(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedprox", "method.mu=0.01")
    spec = strategy.task_spec(0, 1, "train").to_json()
    assert '"role": "proximal"' in spec and '"mu": 0.01' in spec
    assert set(strategy.downlinks([0], 1)[0]) == set(strategy.model.global_arrays)
