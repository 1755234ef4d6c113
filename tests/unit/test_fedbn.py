"""FedBN: its defining behaviours (math on hand numbers; routing and state through the in-process grid)."""

from __future__ import annotations

import numpy as np
from method_helpers import replied_keys
from test_strategy_base import make, run, sent_keys

from pflower.client_app.runtime import fresh_model
from pflower.models import buffer_keys
from pflower.models.schema import batchnorm_keys
from pflower.simulation.inprocess import InProcessGrid, personal_state


# ----------------------------------------------------------------------------- FedBN
def test_fedbn_bn_parameters_and_buffers_never_travel(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedbn")
    model = fresh_model(strategy.run.client_spec)
    bn = set(batchnorm_keys(model))
    assert bn == {f"groups.conv{i}.1.{p}" for i in (1, 2) for p in ("weight", "bias")}
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=2)
    expected = set(strategy.model.global_arrays) - bn
    travelled = sent_keys(grid) + replied_keys(grid)
    assert travelled and all(keys == expected for keys in travelled)  # conv weights go, BN stays
    assert not any(k in bn or k in buffer_keys(model) for keys in travelled for k in keys)
    assert all(not r["dropped"] for r in records)
    trained = [s for c in grid.contexts.values() if (s := personal_state(c)) is not None]
    assert len(trained) >= 2 and all(bn <= set(s.keys()) for s in trained)  # persisted on the client
    gammas = [s["groups.conv1.1.weight"] for s in trained]
    assert not np.array_equal(gammas[0], gammas[1])  # and personal
