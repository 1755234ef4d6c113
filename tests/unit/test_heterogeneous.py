"""Clients of different architectures: per-client model schemas in messages, validation,
aggregation, node announcements and the config rules (``model=mixed``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array
from test_strategy_base import make, run

from pflower.models.schema import assign_archs
from pflower.server_app.config import ConfigError
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.fedper import FedPer

MIXED = ["model=mixed", "num_clients=6", "fraction=1.0"]  # lenet5 with 1 FC layer, with 3, and the KAPC CNN


def train_specs(grid):
    out = []
    for m in grid.sent:
        if m.metadata.message_type == "train":
            cfg = m.content.config_records["config"]
            out.append((int(cfg["client-id"]), json.loads(cfg["spec"]), set(m.content.array_records["arrays"].keys())))
    return out


def test_every_client_gets_its_own_architectures_model_and_only_equals_are_averaged(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedavg", *MIXED)
    assert strategy.model.arch_of == {
        0: "lenet5_1fc",
        1: "lenet5_1fc",
        2: "lenet5_3fc",
        3: "lenet5_3fc",
        4: "cnn_kapc",
        5: "cnn_kapc",
    }
    schemas = strategy.model.schemas
    assert schemas["lenet5_1fc"].groups == ("conv1", "conv2", "classifier") and "fc1" in schemas["lenet5_3fc"].groups
    grid = InProcessGrid(6)
    records = run(strategy, grid, rounds=1)
    sent = train_specs(grid)
    assert [c for c, *_ in sent] == list(range(6))
    for cid, spec, keys in sent:
        arch = strategy.model.arch_of[cid]
        assert spec["arch"] == arch and spec["model"] == schemas[arch].spec  # the client builds its own model
        assert keys == set(schemas[arch].keys())  # ... and receives that model's tensors
    replies = {
        int(r.content.metric_records["metrics"]["client-id"]): r
        for r in grid.replies
        if r.metadata.message_type == "train"
    }
    for arch, members in (("lenet5_1fc", [0, 1]), ("lenet5_3fc", [2, 3]), ("cnn_kapc", [4, 5])):
        n = [replies[c].content.metric_records["metrics"]["num-examples"] for c in members]
        for key, value in strategy.model.arrays[arch].items():
            ups = [replies[c].content.array_records["arrays"][key].numpy().astype(np.float64) for c in members]
            np.testing.assert_allclose(value, sum(w * u for w, u in zip(n, ups)) / sum(n), rtol=1e-6)
    assert {"test_before_acc@lenet5_1fc", "test_before_acc@cnn_kapc"} <= set(records[0])
    assert {"final_acc@lenet5_3fc", "final_acc@cnn_kapc"} <= set(strategy.final_metrics)


def test_a_reply_holding_another_architectures_tensors_is_rejected(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedavg", *MIXED)
    grid = InProcessGrid(6)
    strategy.discover(grid)
    other = strategy.model.arrays["lenet5_3fc"]

    def swap(reply):  # client 0 (lenet5_1fc) answers with lenet5_3fc's tensors
        reply.content.array_records["arrays"] = type(reply.content.array_records["arrays"])(
            {k: Array(v) for k, v in other.items()}
        )
        return reply

    grid.tamper = {0: swap}
    before = {k: v.copy() for k, v in strategy.model.arrays["lenet5_1fc"].items()}
    records = run(strategy, grid, rounds=1)
    assert [d["client"] for d in records[0]["dropped"]] == [0] and "array keys differ" in records[0]["dropped"][0][
        "reason"
    ]
    # client 1 alone made lenet5_1fc's model: client 0's numbers are nowhere in it
    assert records[0]["clients"] == [1, 2, 3, 4, 5]
    assert not all(np.array_equal(before[k], strategy.model.arrays["lenet5_1fc"][k]) for k in before)


def test_a_node_announcing_its_model_gets_it_and_an_unknown_model_is_refused(compose, tiny_overrides, caplog):
    _, strategy = make(compose, tiny_overrides, "method=fedavg", *MIXED)
    grid = InProcessGrid(6)
    grid.contexts[grid.node_of_client[0]].node_config["model"] = "cnn_kapc"  # the rule said lenet5_1fc
    grid.contexts[grid.node_of_client[5]].node_config["model"] = "resnet152"
    strategy.discover(grid, timeout=0)
    assert strategy.model.arch_of[0] == "cnn_kapc" and 5 not in strategy.clients
    assert "client 5 runs model 'resnet152'" in caplog.text and "model.archs" in caplog.text
    strategy.min_available = 5  # the run goes on without the refused node (instead of waiting for it)
    records = run(strategy, grid, rounds=1)
    spec = next(s for c, s, _ in train_specs(grid) if c == 0)
    assert spec["arch"] == "cnn_kapc" and 0 in records[0]["clients"]


def test_a_node_changing_its_model_within_a_run_is_refused(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedavg", *MIXED)
    assert strategy.model.take_announced(2, "lenet5_3fc") is None
    assert "one client, one model" in strategy.model.take_announced(2, "cnn_kapc")


def test_the_client_refuses_a_model_spec_other_than_its_own(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedavg", *MIXED)
    grid = InProcessGrid(6)
    strategy.discover(grid)
    grid.contexts[grid.node_of_client[2]].node_config["model"] = "cnn_kapc"  # changed after it joined
    records = run(strategy, grid, rounds=1)
    [drop] = records[0]["dropped"]
    assert drop["client"] == 2 and "this node runs 'cnn_kapc'" in drop["reason"]


def test_methods_for_one_architecture_refuse_a_mixed_config(compose, tiny_overrides):
    with pytest.raises(ConfigError, match="runs one architecture on every client.*fedavg"):
        compose(*tiny_overrides, "method=fedper", *MIXED)
    cfg, fedavg = make(compose, tiny_overrides, "method=fedavg", *MIXED)
    from pflower.server_app.runner import build_models

    with pytest.raises(ValueError, match="runs one architecture"):
        FedPer(
            build_models(cfg),
            {**fedavg.run.client_spec, "archs": {a: s.spec for a, s in fedavg.model.schemas.items()}},
            num_clients=6,
        )
    with pytest.raises(AttributeError, match=r"self\.model\.arrays\[arch\]"):
        fedavg.model.global_arrays  # there is no one global model


def test_homogeneous_runs_are_the_one_architecture_case(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedavg")
    assert list(strategy.model.schemas) == ["lenet5"] and set(strategy.model.arch_of.values()) == {"lenet5"}
    assert strategy.model.global_arrays is strategy.model.arrays["lenet5"]
    state = strategy.state_dict()
    assert state["arch_arrays"] == {} and state["global_arrays"] is strategy.model.global_arrays


def test_assignment_rules():
    archs = ["a", "b", "c"]
    assert assign_archs("blocks", archs, 6) == {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
    assert assign_archs("blocks", archs, 20)[6] == "a" and assign_archs("blocks", archs, 20)[7] == "b"
    assert assign_archs("round_robin", archs, 4) == {0: "a", 1: "b", 2: "c", 3: "a"}
    assert assign_archs({0: "c", "1": "a"}, archs, 2) == {0: "c", 1: "a"}
    with pytest.raises(ValueError, match="names no architecture for client"):
        assign_archs({0: "a"}, archs, 2)
    with pytest.raises(ValueError, match="model.archs has"):
        assign_archs({0: "z", 1: "a"}, archs, 2)
    with pytest.raises(ValueError, match="blocks"):
        assign_archs("random", archs, 2)


def test_mixed_config_errors_name_the_key(compose, tiny_overrides):
    with pytest.raises(ConfigError, match="unknown model 'resnet9'"):
        compose(*tiny_overrides, "model=mixed", "model.archs.cnn_kapc.name=resnet9")
    with pytest.raises(ConfigError, match="names no architecture for client"):
        compose(*tiny_overrides, "model=mixed", "num_clients=4", "model.assign={0: lenet5_1fc}")


def test_fedavg_across_architectures_keeps_heterogeneous_state_through_a_checkpoint(compose, tiny_overrides):
    from pflower.strategies.base.checkpoint import decode, encode

    _, strategy = make(compose, tiny_overrides, "method=fedavg", *MIXED)
    run(strategy, InProcessGrid(6), rounds=1)
    arrays: dict = {}
    tree = encode(strategy.state_dict(), arrays)
    _, fresh = make(compose, tiny_overrides, "method=fedavg", *MIXED)
    fresh.load_state_dict(decode(tree, arrays, fresh.state_dict()))
    for arch in strategy.model.schemas:
        assert all(
            np.array_equal(strategy.model.arrays[arch][k], fresh.model.arrays[arch][k])
            for k in strategy.model.arrays[arch]
        )
    assert fresh.model.arch_of == strategy.model.arch_of
    bad = dict(decode(tree, arrays))
    bad["arch_arrays"] = {"lenet5_3fc": bad["arch_arrays"]["lenet5_3fc"]}
    with pytest.raises(ValueError, match="architectures"):
        fresh.load_state_dict(bad)


def test_local_runs_any_mix_of_architectures(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=local", *MIXED)
    records = run(strategy, InProcessGrid(6), rounds=1)
    assert records[0]["bytes_down"] == records[0]["bytes_up"] == 0 and records[0]["clients"] == list(range(6))
