"""The strategy base through an in-process Grid (no Ray): routing, validation, bytes, protocol."""

import dataclasses

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from pflower.client_app.roles import ROLES, SGDRole
from pflower.protocol.wire import WIRE_EXTRA_PREFIX
from pflower.server_app.runner import build
from pflower.simulation.inprocess import InProcessGrid, personal_state
from pflower.strategies import STRATEGIES
from pflower.strategies.base.hooks import Uplink
from pflower.strategies.base.strategy import PersonalizedStrategy
from pflower.strategies.fedavg import FedAvg


def make(compose, tiny_overrides, *extra):
    cfg = compose(*tiny_overrides, *extra)
    return cfg, build(cfg, run_token="test-run")


def run(strategy: PersonalizedStrategy, grid: InProcessGrid, rounds: int = 2):
    records = []
    strategy.start(grid, num_rounds=rounds, on_round=records.append)
    return records


def sent_keys(grid, message_type="train"):
    return [set(m.content.array_records["arrays"].keys()) for m in grid.sent if m.metadata.message_type == message_type]


def test_fedper_never_sends_the_classifier(compose, tiny_overrides):
    cfg, strategy = make(compose, tiny_overrides, "method=fedper")
    grid = InProcessGrid(4)
    records = run(strategy, grid)
    classifier = set(strategy.model.keys(["classifier"]))
    body = set(strategy.model.keys(strategy.model.groups[:-1]))
    assert all(keys == body for keys in sent_keys(grid))
    up = [set(r.content.array_records["arrays"].keys()) for r in grid.replies if r.metadata.message_type == "train"]
    assert up and all(keys == body and not keys & classifier for keys in up)
    body_bytes = sum(strategy.model.global_arrays[k].nbytes for k in body)
    for r in records:
        assert r["groups_down"] == r["groups_up"] == strategy.model.groups[:-1]
        n = len(r["clients"])
        assert body_bytes * n <= r["bytes_down"] < body_bytes * n * 1.05  # arrays + small headers
    # the personal classifier persisted on the client: its state holds it
    trained = [s for c in grid.contexts.values() if (s := personal_state(c)) is not None]
    assert trained and all(classifier <= set(s) for s in trained)


def test_fedavg_sends_everything_but_bn_buffers(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedavg")
    grid = InProcessGrid(4)
    run(strategy, grid, rounds=1)
    keys = sent_keys(grid)
    assert keys and all(k == set(strategy.model.global_arrays) for k in keys)
    assert not any("running" in key or "num_batches" in key for k in keys for key in k)


def test_local_communicates_nothing(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=local")
    before = {k: v.copy() for k, v in strategy.model.global_arrays.items()}
    records = run(strategy, InProcessGrid(4))
    assert all(r["bytes_down"] == 0 and r["bytes_up"] == 0 for r in records)
    assert all(np.array_equal(before[k], strategy.model.global_arrays[k]) for k in before)
    assert records[-1]["test_after_acc"] > 0.2  # they do learn locally


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_sampling_is_seeded_and_identical_across_methods(compose, tiny_overrides):
    picks = []
    for method in ("fedavg", "fedper", "fedavg"):
        _, strategy = make(compose, tiny_overrides, f"method={method}")
        grid = InProcessGrid(4)
        picks.append([r["clients"] for r in run(strategy, grid, rounds=3)])
    assert picks[0] == picks[1] == picks[2]
    assert all(len(c) == 2 for c in picks[0])


def test_bad_replies_are_dropped_and_the_round_goes_on(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedavg", "fraction=1.0")
    grid = InProcessGrid(4)

    def nan_weights(reply):
        rec = reply.content.array_records["arrays"]
        key = next(iter(rec.keys()))
        rec[key] = Array(np.full(rec[key].numpy().shape, np.nan, np.float32))
        return reply

    def forged_count(reply):
        reply.content.metric_records["metrics"]["num-examples"] = 10**6
        return reply

    grid.tamper = {0: nan_weights, 1: forged_count}
    grid.fail = {2}
    records = run(strategy, grid, rounds=1)
    reasons = {d["client"]: d["reason"] for d in records[0]["dropped"]}
    assert set(reasons) == {0, 1, 2}
    assert "NaN" in reasons[0] and "forged" in reasons[1] and "crashed" in reasons[2]
    assert records[0]["clients"] == [3]
    assert all(np.all(np.isfinite(v)) for v in strategy.model.global_arrays.values())
    # bytes_up counts what arrived, the rejected replies' arrays included (the crash sent none)
    arrived = [r for r in grid.replies if r.metadata.message_type == "train" and not r.has_error()]
    assert len(arrived) == 3
    assert records[0]["bytes_up"] == sum(
        len(a.data) for r in arrived for a in r.content.array_records["arrays"].values()
    )


def test_superlink_node_unavailable_reply_drops_that_client_once(compose, tiny_overrides):
    """The SuperLink answers for an offline node from node 0: the reply is matched by message id."""
    _, strategy = make(compose, tiny_overrides, "method=fedavg", "fraction=1.0")
    grid = InProcessGrid(4)
    strategy.discover(grid)
    grid.unavailable = {2}  # it joined, then stopped sending heartbeats
    records = run(strategy, grid, rounds=1)
    assert records[0]["clients"] == [0, 1, 3]
    [dropped] = records[0]["dropped"]
    assert dropped["client"] == 2 and "Node Unavailable" in dropped["reason"]


def test_node_the_superlink_reports_unavailable_at_discovery_is_named(compose, tiny_overrides, caplog):
    _, strategy = make(compose, tiny_overrides, "method=fedavg")
    grid = InProcessGrid(4)
    grid.unavailable = {2}
    strategy.discover(grid, timeout=0)
    assert sorted(strategy.clients) == [0, 1, 3]
    assert f"node {grid.node_of_client[2]} could not join: Error: Node Unavailable" in caplog.text


def test_vanished_node_is_reported_and_restarted_node_is_rediscovered(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedavg", "fraction=1.0")
    grid = InProcessGrid(4)
    strategy.discover(grid)
    grid.remove_node(grid.node_of_client[1])
    # configure_train re-discovers: client 1 is gone and is not sampled
    msgs = list(strategy.configure_train(1, ArrayRecord(), None, grid))
    assert 1 not in {strategy.ledger.inflight[m.metadata.dst_node_id] for m in msgs}
    grid.add_node(1, node_id=5555)  # same client id, new node id (a restarted SuperNode)
    msgs = list(strategy.configure_train(2, ArrayRecord(), None, grid))
    assert strategy.clients[1].node_id == 5555 and 5555 in {m.metadata.dst_node_id for m in msgs}


def test_wrong_number_of_simulated_nodes_is_a_clear_error(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedavg")
    with pytest.raises(RuntimeError, match="num-supernodes=4"):
        strategy.discover(InProcessGrid(3))


def test_evaluation_protocol_metrics_are_sample_weighted(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedavg")
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=1)
    replies = [r for r in grid.replies if r.metadata.message_type == "train"]
    ms = [r.content.metric_records["metrics"] for r in replies]
    expected = sum(m["test_before_correct"] for m in ms) / sum(m["test_size"] for m in ms)
    assert records[0]["test_before_acc"] == pytest.approx(expected)
    assert strategy.final_metrics["final_clients"] == 4


def test_when_every_node_refuses_to_join_the_run_fails_at_once(compose, tiny_overrides):
    import time

    _, strategy = make(compose, tiny_overrides, "method=fedavg")
    grid = InProcessGrid(4, node_config={"client-id": 99})  # ids outside 0..3: every hello fails
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="no client could join the run: .*outside"):
        strategy.discover(grid)
    assert time.monotonic() - t0 < 30  # not the 300 s discovery timeout


def test_messages_expire_once_their_reply_could_no_longer_count(compose, tiny_overrides):
    """TTL = the wait for the reply + TTL_MARGIN_S: a SuperNode that reconnects after its round
    closed is not handed that round's training (the SuperLink drops the expired message)."""
    from pflower.strategies.base.messaging import TTL_MARGIN_S

    _, strategy = make(compose, tiny_overrides, "method=fedavg", "fraction=1.0", "final_eval=true")
    grid = InProcessGrid(4)
    strategy.start(grid, num_rounds=1, timeout=120.0)
    ttls = {}
    for m in grid.sent:
        ttls.setdefault(m.metadata.message_type, set()).add(m.metadata.ttl)
    assert ttls == {
        "query": {strategy.discover_timeout + TTL_MARGIN_S},
        "train": {120.0 + TTL_MARGIN_S},
        "evaluate": {120.0 + TTL_MARGIN_S},
    }
    train_replies = [r for r in grid.replies if r.metadata.message_type == "train"]
    assert train_replies and all(r.metadata.ttl <= 120.0 + TTL_MARGIN_S for r in train_replies)  # nor do replies


# ----------------------------------------------------------------------------- extra arrays (base)
class EchoRole(SGDRole):
    """Sends back twice the extra array it received, untrained."""

    name = "echo"

    def fit(self, model, data, train_args, ctx):
        ctx.upload_extra["echo/x"] = 2 * ctx.received_extra["probe/x"]
        return {"train_loss": 0.0}


class Echo(FedAvg):
    traits = dataclasses.replace(FedAvg.traits, role="echo")

    def extra_downlinks(self, client_ids, server_round, task="train"):
        return {c: {"probe/x": np.full(3, float(c), np.float32)} for c in client_ids} if task == "train" else {}

    def uplink(self, client_id, server_round):
        return Uplink(self.shared_groups(client_id, server_round), extra={"echo/x": ((3,), np.dtype(np.float32))})

    def aggregate(self, server_round, updates):
        self.echoed = {u.client_id: u.extra for u in updates}
        assert all(not any(k.startswith(WIRE_EXTRA_PREFIX) for k in u.arrays) for u in updates)
        return super().aggregate(server_round, updates)


def test_extra_arrays_reach_the_role_come_back_validated_and_count_as_bytes(compose, tiny_overrides, monkeypatch):
    monkeypatch.setitem(ROLES, "echo", EchoRole)
    monkeypatch.setitem(STRATEGIES, "fedavg", Echo)
    _, strategy = make(compose, tiny_overrides, "method=fedavg", "fraction=1.0")
    grid = InProcessGrid(4)

    def nan_extra(reply):  # a non-finite extra array is dropped like a non-finite weight
        arrays = reply.content.array_records["arrays"]
        arrays["extra/echo/x"] = Array(np.full(3, np.nan, np.float32))
        return reply

    def no_extra(reply):
        del reply.content.array_records["arrays"]["extra/echo/x"]
        return reply

    grid.tamper = {2: nan_extra, 3: no_extra}
    records = run(strategy, grid, rounds=1)
    assert {c: u["echo/x"].tolist() for c, u in strategy.echoed.items()} == {0: [0.0] * 3, 1: [2.0] * 3}
    reasons = {d["client"]: d["reason"] for d in records[0]["dropped"]}
    assert "NaN" in reasons[2] and "missing ['extra/echo/x']" in reasons[3]
    model_bytes = sum(v.nbytes for v in strategy.model.global_arrays.values())
    assert records[0]["bytes_down"] > 4 * (model_bytes + 12)  # the extras count
    assert all(keys == set(strategy.model.global_arrays) | {"extra/probe/x"} for keys in sent_keys(grid))


def test_per_client_accuracy_is_each_clients_own_share_keyed_by_id_in_order():
    from pflower.strategies.base.evaluation import per_client_accuracy

    got = per_client_accuracy({10: {"test_correct": 3.0, "test_size": 4.0}, 2: {"test_correct": 1.0, "test_size": 8.0}})
    assert list(got) == ["2", "10"]  # numeric order, not text order
    assert got == {"2": 0.125, "10": 0.75}


def test_discovery_says_whether_nodes_connected_but_did_not_answer_or_none_connected():
    """Issue 60: `discover_timeout=20` (seconds) with cold ClientApps failed as 'no node connected'
    while Flower listed 3 SuperNodes. The line now tells the two cases apart and names the fix."""
    from pflower.strategies.base.client_directory import ClientDirectory

    directory = ClientDirectory(3, 20.0, lambda cid, arch: None)

    class Silent:  # nodes the SuperLink lists, whose ClientApps never answer in time
        def __init__(self, nodes):
            self.nodes = nodes

        def get_node_ids(self):
            return self.nodes

    directory.query = lambda grid, nodes, hello: []  # asked, nobody answered (no refusal either)
    with pytest.raises(RuntimeError) as err:
        directory.discover(Silent([11, 12, 13]), None, wait_for=3, timeout=0.0)
    assert "3 node(s) connected but none answered within discover_timeout=20 s" in str(err.value)
    assert "raise discover_timeout (seconds, default 300)" in str(err.value)
    with pytest.raises(RuntimeError, match="no node connected; start the SuperNodes"):
        directory.discover(Silent([]), None, wait_for=3, timeout=0.0)
