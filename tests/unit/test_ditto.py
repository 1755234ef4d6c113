"""Ditto: its defining behaviours (math on hand numbers; routing and state through the in-process grid)."""

from __future__ import annotations

import copy

import numpy as np
import torch
from method_helpers import BODY, HEAD, ctx, params, replied_keys, role_args_of, same
from test_strategy_base import make, run

from pflower.client_app.roles import build_role
from pflower.client_app.roles.ditto import PREFIX
from pflower.simulation.inprocess import InProcessGrid, personal_state


# ----------------------------------------------------------------------------- Ditto
def test_ditto_keeps_a_personal_model_and_evaluates_it(client):
    model, data, args = client
    received = copy.deepcopy(model)
    role_ctx = ctx()
    role = build_role("ditto", role_args_of("ditto", lam=0.1, personal_epochs=1))
    assert role.eval_model(model, data, args, role_ctx) is not model  # first contact: a copy of the global
    metrics = role.fit(model, data, args, role_ctx)
    assert set(metrics) == {"train_loss", "personal_loss"}
    personal = {k[len(PREFIX) :]: v for k, v in role_ctx.extra_state.items()}
    assert set(personal) == set(model.state_dict())  # parameters and BN buffers
    assert not same(params(model, BODY + HEAD), {k: personal[k] for k in params(model, BODY + HEAD)})  # v != w
    assert not same(params(model, BODY + HEAD), params(received, BODY + HEAD))  # w was trained and is uploaded
    after = role.trained_model(model, role_ctx)  # test_after: v
    assert same(params(after, BODY + HEAD), {k: personal[k] for k in params(after, BODY + HEAD)})
    # next round: a new global arrives; test_before evaluates the persisted v, not it
    next_role, next_ctx = build_role("ditto", role_args_of("ditto", lam=0.1)), ctx(extra=role_ctx.extra_state)
    evaluated = next_role.eval_model(received, data, args, next_ctx)
    assert all(torch.equal(v, personal[k]) for k, v in evaluated.state_dict().items())


def test_ditto_round_trip_persists_the_personal_model(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=ditto", "fraction=1.0")
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=1)
    assert not records[0]["dropped"] and all(k == set(strategy.model.global_arrays) for k in replied_keys(grid))
    for c in grid.contexts.values():
        v = personal_state(c)["extra.ditto.groups.fc1.0.weight"]
        assert not np.array_equal(v, strategy.model.global_arrays["groups.fc1.0.weight"])  # personal != global
    assert strategy.final_metrics["final_clients"] == 4
