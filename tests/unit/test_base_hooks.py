"""The second-generation hooks of the strategy base, each on the in-process grid.

What a client keeps (``client_keeps``), what it may upload (``uplink_sets``), BN statistics that
travel (``shared_buffers``), the sampling hook, per-round learning rates, server-side evaluation,
and aggregation in client-id order whatever order the replies arrive in.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from test_strategy_base import make, run, sent_keys

from pflower.client_app.roles import ROLES, SGDRole
from pflower.simulation.inprocess import InProcessGrid, personal_state
from pflower.strategies.base.hooks import Uplink
from pflower.strategies.base.replies import ClientsFailed
from pflower.strategies.fedavg import FedAvg
from pflower.strategies.fedcmd import FedCMD
from pflower.strategies.fedper import FedPer


def specs(grid: InProcessGrid, message_type: str = "train") -> list[dict]:
    return [
        json.loads(m.content.config_records["config"]["spec"])
        for m in grid.sent
        if m.metadata.message_type == message_type
    ]


# ----------------------------------------------------------------------------- what a client keeps
class TurnsPersonal(FedAvg):
    """fc2 travels in round 1 and stays on the client from round 2 on (as FedCPMD's per-client layer)."""

    name = "turns_personal"

    def personal_groups(self, client_id, server_round):
        return ["fc2"] if server_round >= 2 else []


class TurnsPersonalKeepingModels(TurnsPersonal):
    traits = dataclasses.replace(TurnsPersonal.traits, client_keeps="model")


@pytest.mark.parametrize("cls, keeps_own", [(TurnsPersonal, False), (TurnsPersonalKeepingModels, True)])
@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_a_group_that_turns_personal_keeps_the_clients_own_value_only_with_whole_model_persistence(
    compose, tiny_overrides, monkeypatch, cls, keeps_own
):
    cfg, base = make(compose, tiny_overrides, "method=fedavg", "fraction=1.0")
    strategy = cls(_model(cfg), base.run.client_spec, num_clients=4, fraction_train=1.0, seed=42)
    fc2 = strategy.model.keys(["fc2"])
    initial = {k: strategy.model.global_arrays[k].copy() for k in fc2}
    seen = {}  # client -> its fc2 when its round-2 training starts
    original = SGDRole.fit

    def spy(self, model, data, args, ctx):
        if ctx.server_round == 2:
            seen[data.client_id] = {k: v.detach().numpy().copy() for k, v in model.state_dict().items() if k in initial}
        return original(self, model, data, args, ctx)

    monkeypatch.setattr(SGDRole, "fit", spy)
    grid = InProcessGrid(4)
    run(strategy, grid, rounds=1)
    trained = {cid: personal_state(grid.contexts[grid.node_of_client[cid]]) for cid in range(4)}
    assert (
        all(set(fc2) <= set(s) for s in trained.values())
        if keeps_own
        else not any(set(fc2) & set(s) for s in trained.values())
    )
    strategy.start(grid, num_rounds=2)  # round 2: fc2 is personal, nothing of it is sent
    assert sorted(seen) == [0, 1, 2, 3] and all(".fc2." not in k for keys in sent_keys(grid)[4:] for k in keys)
    for cid, values in seen.items():
        for k in fc2:
            if keeps_own:  # the client's own round-1 result
                np.testing.assert_array_equal(values[k], trained[cid][k])
                assert not np.array_equal(values[k], initial[k])
            else:  # the seeded initial value: what a method that does not opt in gets
                np.testing.assert_array_equal(values[k], initial[k])


def _model(cfg):
    from pflower.server_app.runner import build_models

    return build_models(cfg)


def test_whole_model_persistence_saves_every_tensor_and_personal_mode_only_the_personal_ones(compose, tiny_overrides):
    cfg, fedper = make(compose, tiny_overrides, "method=fedper", "fraction=1.0")
    grid = InProcessGrid(4)
    run(fedper, grid, rounds=1)
    state = personal_state(grid.contexts[grid.node_of_client[0]])
    assert {k for k in state if "running" not in k and "num_batches" not in k} == set(fedper.model.keys(["classifier"]))

    class FedPerKeeping(FedPer):
        traits = dataclasses.replace(FedPer.traits, client_keeps="model")

    keeping = FedPerKeeping(_model(cfg), fedper.run.client_spec, num_clients=4, fraction_train=1.0, seed=42)
    grid = InProcessGrid(4)
    run(keeping, grid, rounds=1)
    state = personal_state(grid.contexts[grid.node_of_client[0]])
    assert set(keeping.model.global_arrays) | set(keeping.model.keys(["classifier"])) <= set(state)
    assert all(s["keep"] == "model" for s in specs(grid))


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_fedcmd_opting_into_whole_model_persistence_would_change_nothing(compose, tiny_overrides):
    """The measured reason FedCMD does not opt in: every tensor it does not send is its personal
    layer, which it persists anyway (φ_init arrives at the first phase-2 contact, as the FedCMD paper's phase 2 reads),
    so the run is identical, round by round, while each client would store its whole model."""

    class FedCMDKeeping(FedCMD):
        traits = dataclasses.replace(FedCMD.traits, client_keeps="model")

    overrides = ("method=fedcmd", "method.kp=2", "fraction=0.5", "rounds=5")
    cfg, plain = make(compose, tiny_overrides, *overrides)
    keeping = FedCMDKeeping(_model(cfg), plain.run.client_spec, num_clients=4, fraction_train=0.5, seed=42, kp=2)
    histories = []
    for strategy in (plain, keeping):
        histories.append(run(strategy, InProcessGrid(4), rounds=5))
    strip = [[{k: v for k, v in r.items() if not k.endswith("_s")} for r in h] for h in histories]
    assert strip[0] == strip[1]
    assert {r["phase"] for r in histories[0]} == {1, 2}


# ----------------------------------------------------------------------------- client-chosen uploads
class PrefixRole(SGDRole):
    """Uploads only the first ``keep`` of the keys it may send (a stand-in for BLS's Ω)."""

    name = "prefix"

    def fit(self, model, data, args, ctx):
        out = super().fit(model, data, args, ctx)
        keep = 6 if ctx.server_round % 2 else len(ctx.upload_keys)
        ctx.upload_keys = ctx.upload_keys[:keep]
        return out


class Prefixes(FedAvg):
    traits = dataclasses.replace(FedAvg.traits, role="prefix")

    def uplink(self, client_id, server_round):
        keys = self.model.keys()
        return Uplink(self.model.groups, key_sets=[keys[:n] for n in range(2, len(keys) + 1, 2)])  # even prefixes

    def aggregate(self, server_round, updates):
        self.uploaded = {u.client_id: list(u.arrays) for u in updates}
        return super().aggregate(server_round, updates)


def test_a_client_may_upload_any_declared_set_and_bytes_count_what_came(compose, tiny_overrides, monkeypatch):
    monkeypatch.setitem(ROLES, "prefix", PrefixRole)
    cfg, base = make(compose, tiny_overrides, "method=fedavg", "fraction=1.0")
    strategy = Prefixes(_model(cfg), base.run.client_spec, num_clients=4, fraction_train=1.0, seed=42)
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=2)
    keys = strategy.model.keys()
    replies = [r for r in grid.replies if r.metadata.message_type == "train"]
    assert [set(r.content.array_records["arrays"].keys()) for r in replies] == [set(keys[:6])] * 4 + [set(keys)] * 4
    up_1 = sum(len(a.data) for r in replies[:4] for a in r.content.array_records["arrays"].values())
    assert records[0]["bytes_up"] == up_1 and records[0]["dropped"] == [] and records[0]["clients"] == [0, 1, 2, 3]
    assert records[0]["groups_up"] == ["conv1", "conv2"]  # the first 6 keys: conv1's 4 tensors and conv2's weight, bias
    assert strategy.uploaded == {c: keys for c in range(4)}


def test_a_set_the_strategy_did_not_declare_is_rejected(compose, tiny_overrides, monkeypatch):
    class OddRole(PrefixRole):
        def fit(self, model, data, args, ctx):
            out = SGDRole.fit(self, model, data, args, ctx)
            ctx.upload_keys = ctx.upload_keys[:5]  # odd length: not declared
            return out

    monkeypatch.setitem(ROLES, "prefix", OddRole)
    cfg, base = make(compose, tiny_overrides, "method=fedavg", "fraction=1.0")
    strategy = Prefixes(_model(cfg), base.run.client_spec, num_clients=4, fraction_train=1.0, seed=42)
    before = {k: v.copy() for k, v in strategy.model.global_arrays.items()}
    records = run(strategy, InProcessGrid(4), rounds=1)
    assert records[0]["clients"] == [] and len(records[0]["dropped"]) == 4
    assert all("upload sets the server allows" in d["reason"] for d in records[0]["dropped"])
    assert all(np.array_equal(before[k], strategy.model.global_arrays[k]) for k in before)


def test_a_role_cannot_upload_what_the_server_did_not_ask_for(compose, tiny_overrides, monkeypatch):
    class Greedy(SGDRole):
        name = "greedy"

        def fit(self, model, data, args, ctx):
            ctx.upload_keys = [*ctx.upload_keys, "groups.classifier.weight"]
            return super().fit(model, data, args, ctx)

    monkeypatch.setitem(ROLES, "greedy", Greedy)

    class AskGreedy(FedPer):
        traits = dataclasses.replace(FedPer.traits, role="greedy")

    cfg, base = make(compose, tiny_overrides, "method=fedper", "fraction=1.0")
    # every client's ClientApp refuses: the run stops on that round, naming the refusal
    with pytest.raises(ClientsFailed, match="round 1: .*did not ask for"):
        run(
            AskGreedy(_model(cfg), base.run.client_spec, num_clients=4, fraction_train=1.0, seed=42),
            InProcessGrid(4),
            rounds=1,
        )


# ----------------------------------------------------------------------------- BN statistics
class SharedStats(FedAvg):
    traits = dataclasses.replace(FedAvg.traits, shared_buffers=True)


def test_shared_buffers_send_and_average_bn_running_statistics_but_never_the_counter(compose, tiny_overrides):
    cfg, base = make(compose, tiny_overrides, "method=fedavg", "fraction=1.0")
    strategy = SharedStats(_model(cfg), base.run.client_spec, num_clients=4, fraction_train=1.0, seed=42)
    stats = [k for k in strategy.model.global_arrays if "running_" in k]
    assert stats and not any("num_batches" in k for k in strategy.model.global_arrays)
    # BN's initial values
    assert all(np.all(strategy.model.global_arrays[k] == (0.0 if "mean" in k else 1.0)) for k in stats)
    grid = InProcessGrid(4)
    run(strategy, grid, rounds=1)
    assert all(set(stats) <= keys and not any("num_batches" in k for k in keys) for keys in sent_keys(grid))
    replies = [r for r in grid.replies if r.metadata.message_type == "train"]
    ups = [{k: r.content.array_records["arrays"][k].numpy() for k in stats} for r in replies]
    n = [r.content.metric_records["metrics"]["num-examples"] for r in replies]
    for k in stats:  # FedAvg'd like parameters
        expected = sum(w * u[k].astype(np.float64) for w, u in zip(n, ups)) / sum(n)
        np.testing.assert_allclose(strategy.model.global_arrays[k], expected, rtol=1e-6)
    assert all(s["shared_buffers"] for s in specs(grid))


# ----------------------------------------------------------------------------- sampling and order
class EvenOnly(FedAvg):
    def sample(self, server_round):
        return self.run.draw([c for c in range(self.run.num_clients) if c % 2 == 0], 1)


def test_the_sampling_hook_decides_who_trains(compose, tiny_overrides):
    cfg, base = make(compose, tiny_overrides, "method=fedavg")
    strategy = EvenOnly(_model(cfg), base.run.client_spec, num_clients=4, fraction_train=0.5, seed=42)
    records = run(strategy, InProcessGrid(4), rounds=4)
    assert all(len(r["clients"]) == 1 and r["clients"][0] % 2 == 0 for r in records)


def test_replies_are_aggregated_in_client_id_order_whatever_order_they_arrive_in(compose, tiny_overrides):
    results = []
    for reverse in (False, True):
        _, strategy = make(compose, tiny_overrides, "method=fedavg", "fraction=1.0")
        grid = InProcessGrid(4)
        strategy.discover(grid)
        messages = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid))
        replies = list(grid.send_and_receive(messages))
        strategy.aggregate_train(1, replies[::-1] if reverse else replies)
        results.append({k: v.copy() for k, v in strategy.model.global_arrays.items()})
        assert strategy.run.history[-1]["clients"] == [0, 1, 2, 3]
    assert all(np.array_equal(results[0][k], results[1][k]) for k in results[0])  # bit for bit


# ----------------------------------------------------------------------------- learning rate and server evaluation
def test_the_learning_rate_of_each_round_reaches_the_clients(compose, tiny_overrides):
    _, strategy = make(
        compose,
        tiny_overrides,
        "method=fedavg",
        "rounds=4",
        "lr=0.1",
        "lr_schedule.kind=multistep",
        "lr_schedule.milestones=[0.5,3]",
        "lr_schedule.gamma=0.5",
    )
    grid = InProcessGrid(4)
    run(strategy, grid, rounds=4)
    by_round = {}
    for m in grid.sent:
        if m.metadata.message_type == "train":
            by_round[int(m.content.config_records["config"]["server-round"])] = json.loads(
                m.content.config_records["config"]["spec"]
            )["train"]["lr"]
    assert by_round == pytest.approx({1: 0.1, 2: 0.1, 3: 0.05, 4: 0.025})  # milestones: round 2 (0.5 x 4), round 3


def test_evaluate_fn_is_called_every_round_and_its_metrics_join_the_record(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedavg")
    calls = []

    def evaluate_fn(server_round, arrays):
        calls.append((server_round, set(arrays.keys())))
        return MetricRecord({"acc": 0.25 * server_round})

    records = []
    strategy.start(InProcessGrid(4), num_rounds=2, evaluate_fn=evaluate_fn, on_round=records.append)
    assert [c[0] for c in calls] == [1, 2] and calls[0][1] == set(strategy.model.global_arrays)
    assert [r["server_acc"] for r in records] == [0.25, 0.5]
