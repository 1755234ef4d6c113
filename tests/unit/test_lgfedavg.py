"""LG-FedAvg: its defining behaviours (math on hand numbers; routing and state through the in-process grid)."""

from __future__ import annotations

from method_helpers import replied_keys
from test_strategy_base import make, run, sent_keys

from pflower.simulation.inprocess import InProcessGrid, personal_state


# ----------------------------------------------------------------------------- LG-FedAvg
def test_lgfedavg_lower_groups_stay_upper_groups_travel(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=lgfedavg")
    assert strategy.local_groups == ["conv1", "conv2"]
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=2)
    upper = set(strategy.model.keys(["fc1", "fc2", "classifier"]))
    assert all(keys == upper for keys in sent_keys(grid) + replied_keys(grid))
    assert all(r["groups_down"] == r["groups_up"] == ["fc1", "fc2", "classifier"] for r in records)
    states = [s for c in grid.contexts.values() if (s := personal_state(c)) is not None]
    assert states and all(set(strategy.model.keys(["conv1", "conv2"])) <= set(s.keys()) for s in states)
    _, custom = make(compose, tiny_overrides, "method=lgfedavg", "method.local_groups=[conv1]")
    assert custom.personal_groups(0, 1) == ["conv1"]
