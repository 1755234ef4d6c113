"""FedBABU: its defining behaviours (math on hand numbers; routing and state through the in-process grid)."""

from __future__ import annotations

import numpy as np
import pytest
from method_helpers import BODY, HEAD, ctx, params, replied_keys, role_args_of, same
from test_strategy_base import make, run, sent_keys

from pflower.client_app.roles import build_role
from pflower.simulation.inprocess import InProcessGrid, personal_state


# ----------------------------------------------------------------------------- FedBabu
def test_fedbabu_role_never_trains_the_head_and_evaluates_a_fine_tuned_copy(client):
    model, data, args = client
    head0, body0 = params(model, HEAD), params(model, BODY)
    role = build_role("fedbabu", role_args_of("fedbabu", head=HEAD, finetune_epochs=1, finetune_part="all"))
    tuned = role.eval_model(model, data, args, ctx(HEAD))
    assert not same(params(tuned, HEAD), head0) and not same(params(tuned, BODY), body0)  # fine-tuned copy
    assert same(params(model, HEAD), head0) and same(params(model, BODY), body0)  # the model itself untouched
    role.fit(model, data, args, ctx(HEAD))
    assert same(params(model, HEAD), head0) and not same(params(model, BODY), body0)
    head_only = build_role("fedbabu", role_args_of("fedbabu", head=HEAD, finetune_epochs=1, finetune_part="head"))
    tuned = head_only.eval_model(model, data, args, ctx(HEAD))
    assert not same(params(tuned, HEAD), head0) and same(params(tuned, BODY), params(model, BODY))


def test_fedbabu_never_sends_the_head_and_test_before_uses_the_fine_tuned_model(compose, tiny_overrides):
    losses = {}
    for epochs in (0, 1):
        _, strategy = make(compose, tiny_overrides, "method=fedbabu", f"method.finetune_epochs={epochs}")
        initial_head = {k: strategy.model.global_arrays[k].copy() for k in strategy.model.keys(HEAD)}
        grid = InProcessGrid(4)
        records = run(strategy, grid, rounds=2)
        body = set(strategy.model.keys(BODY))
        assert all(keys == body for keys in sent_keys(grid) + replied_keys(grid))
        for c in grid.contexts.values():  # the persisted head is still the initial one
            state = personal_state(c)
            if state is not None:
                assert all(np.array_equal(state[k], v) for k, v in initial_head.items())
        losses[epochs] = records[0]["test_before_loss"]
    assert losses[1] != pytest.approx(losses[0])  # same clients and models: only the fine-tuning differs
