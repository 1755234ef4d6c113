"""MOON: its defining behaviours (math on hand numbers; routing and state through the in-process grid)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from method_helpers import ctx, replied_keys, role_args_of, trained_states
from test_strategy_base import make, run, sent_keys

from pflower.client_app.roles import build_role
from pflower.client_app.roles.moon import PREFIX as MOON_PREFIX
from pflower.client_app.roles.moon import contrastive_term, previous_model
from pflower.simulation.inprocess import InProcessGrid


# ----------------------------------------------------------------------------- MOON
def test_moon_contrastive_term_on_hand_features():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    z_glob = torch.tensor([[2.0, 0.0], [0.0, 1.0]])  # cosine 1 with z
    z_prev = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])  # cosine 0 with z
    expected = -math.log(math.exp(2.0) / (math.exp(2.0) + 1.0))  # sims 1 and 0 over tau = 0.5
    assert float(contrastive_term(z, z_glob, z_prev, 0.5)) == pytest.approx(expected)
    assert float(contrastive_term(z, z_prev, z_glob, 0.5)) == pytest.approx(-math.log(1.0 / (1.0 + math.exp(2.0))))
    assert float(contrastive_term(z, z_glob, z_glob, 0.5)) == pytest.approx(math.log(2.0))


def test_moon_persists_the_previous_local_model_between_rounds(client):
    model, data, args = client
    role_ctx = ctx()
    assert all(
        torch.equal(a, b)
        for a, b in zip(previous_model(model, role_ctx).state_dict().values(), model.state_dict().values())
    )
    metrics = build_role("moon", role_args_of("moon", mu=1.0, tau=0.5)).fit(model, data, args, role_ctx)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    assert set(role_ctx.extra_state) == {MOON_PREFIX + k for k in trained} and math.isfinite(metrics["train_loss"])
    next_round = copy.deepcopy(model)
    with torch.no_grad():
        for p in next_round.parameters():
            p.zero_()  # a new global model arrives
    prev = previous_model(next_round, ctx(extra=role_ctx.extra_state))
    assert all(torch.equal(prev.state_dict()[k], trained[k]) for k in trained)
    assert not any(p.requires_grad for p in prev.parameters()) and not prev.training


def test_moon_round_trip_is_fedavg_with_the_previous_model_on_the_client(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=moon", "fraction=1.0")
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=1)
    assert not records[0]["dropped"] and all(
        k == set(strategy.model.global_arrays) for k in sent_keys(grid) + replied_keys(grid)
    )
    assert all(any(k.startswith("extra." + MOON_PREFIX) for k in s) for s in trained_states(grid).values())
