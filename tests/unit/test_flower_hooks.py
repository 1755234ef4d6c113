"""Flower's strategy hooks keep Flower's meaning on pflower's strategies: ``configure_train`` gets the
global model Flower's loop carries and ``start()``'s ``train_config``, which every train message
carries; ``fraction_evaluate`` and ``evaluate_config`` run Flower's per-round evaluation."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord
from test_strategy_base import make

from pflower.protocol import wire
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies import FedAvg, FedPer


@pytest.fixture
def setup(compose, tiny_overrides):
    """A model and the client spec of the tiny digits run (pflower's own ClientApp serves it)."""
    from pflower.server_app.runner import build_models

    cfg, base = make(compose, tiny_overrides, "method=fedavg")
    return (lambda: build_models(cfg)), base.run.client_spec


def numpy_of(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy().copy() for k, v in record.items()}


class Recording(FedAvg):
    """FedAvg that records what Flower's loop hands its hooks."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._calls: list[tuple[str, int, dict, dict]] = []

    def configure_train(self, server_round, arrays, config, grid):
        self._calls.append(("train", server_round, numpy_of(arrays), dict(config)))
        return super().configure_train(server_round, arrays, config, grid)

    def configure_evaluate(self, server_round, arrays, config, grid):
        self._calls.append(("evaluate", server_round, numpy_of(arrays), dict(config)))
        return super().configure_evaluate(server_round, arrays, config, grid)


def configs_sent(grid: InProcessGrid, message_type: str) -> list[dict]:
    return [dict(m.content[wire.CONFIG_RECORD]) for m in grid.sent if m.metadata.message_type == message_type]


def test_configure_train_gets_the_runs_arrays_and_config_and_every_message_carries_the_config(setup):
    model, spec = setup
    net = model()
    lr = spec["train"]["lr"]
    state = {k: v.numpy() for k, v in net.state_dict().items()}
    strategy = Recording(model(), spec, num_clients=3, fraction_train=1.0)
    after: list[dict[str, np.ndarray]] = []
    grid = InProcessGrid(3)
    strategy.start(
        grid,
        initial_arrays=ArrayRecord(net.state_dict()),
        num_rounds=2,
        train_config=ConfigRecord({"lr": lr, "note": "from start"}),
        on_round=lambda record: after.append(numpy_of(strategy.global_record())),
    )
    train = [c for c in strategy._calls if c[0] == "train"]
    assert [c[1] for c in train] == [1, 2]
    first, second = train[0][2], train[1][2]
    assert set(first) <= set(state)  # the model's own names, as Flower's loop carries them
    assert all(np.array_equal(first[k], state[k]) for k in first)  # round 1: initial_arrays
    assert all(np.array_equal(second[k], after[0][k]) for k in second)  # round 2: round 1's aggregate
    assert not all(np.array_equal(first[k], second[k]) for k in first)
    assert all(c[3] == {"lr": lr, "note": "from start"} for c in train)
    sent = configs_sent(grid, "train")
    assert len(sent) == 6 and all(c["note"] == "from start" and c[wire.PLAIN_LR] == lr for c in sent)
    assert [c[wire.ROUND_KEY] for c in sent] == [1, 1, 1, 2, 2, 2]  # the contract's keys are the base's


def test_a_train_config_naming_a_client_spec_setting_otherwise_is_refused(setup):
    model, spec = setup
    strategy = FedAvg(model(), spec, num_clients=3)
    with pytest.raises(ValueError, match=r"train_config sets \{'lr': 9.5\}, which client_spec sets otherwise"):
        strategy.start(grid=InProcessGrid(3), train_config=ConfigRecord({"lr": 9.5}))


def test_fraction_evaluate_runs_flowers_evaluation_every_round_with_the_evaluate_config(setup):
    """Two of four clients evaluated after each round (a draw of its own), their numbers in the
    round's record; the training (pflower's protocol) and the final evaluation are unchanged."""
    model, spec = setup
    plain = FedPer(model(), spec, num_clients=4, fraction_train=0.5)
    plain.start(InProcessGrid(4), num_rounds=2)
    grid = InProcessGrid(4)
    strategy = FedPer(model(), spec, num_clients=4, fraction_train=0.5, fraction_evaluate=0.5)
    result = strategy.start(grid, num_rounds=2, evaluate_config=ConfigRecord({"tag": "every round"}))
    for record, before in zip(strategy.run.history, plain.run.history):
        assert record["evaluate_clients"] == 2 and 0.0 <= record["evaluate_acc"] <= 1.0
        assert record["test_before_acc"] == before["test_before_acc"] and record["clients"] == before["clients"]
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2]
    evaluated = configs_sent(grid, "evaluate")
    assert len(evaluated) == 2 + 2 + 4  # two per round, then every client's final evaluation
    assert all(c["tag"] == "every round" for c in evaluated[:4]) and "tag" not in evaluated[-1]
    assert strategy.final_metrics["final_clients"] == 4 == plain.final_metrics["final_clients"]
    assert strategy.final_metrics["final_acc"] == plain.final_metrics["final_acc"]


def test_without_fraction_evaluate_configure_evaluate_sends_nothing_as_flowers_fedavg_at_zero(setup):
    model, spec = setup
    strategy = FedAvg(model(), spec, num_clients=2)
    assert strategy.configure_evaluate(1, ArrayRecord(), ConfigRecord(), InProcessGrid(2)) == []
