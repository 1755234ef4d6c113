"""Late replies: a reply that comes after the server stopped waiting is refused, logged and listed
in the next round's record (strategies/base/messaging.py), over a push/pull grid."""

import logging

from flwr.app import ConfigRecord, Message, RecordDict

from pflower.protocol import wire
from pflower.server_app.runner import build
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.base import messaging
from pflower.strategies.base.messaging import LateReplies


class PushPullGrid:
    """Flower's push/pull Grid API over an :class:`InProcessGrid`: every reply is computed at the
    push; a ``slow`` client's reply becomes pullable only at the push after next (its round has
    closed by then, the next round is running)."""

    def __init__(self, inner: InProcessGrid, slow: set[int]) -> None:
        self.inner, self.slow = inner, slow
        self.ready: dict[str, Message] = {}
        self.held: list[Message] = []
        self.pulled_ids: list[set[str]] = []

    def __getattr__(self, name):  # get_node_ids, create_message, ...
        return getattr(self.inner, name)

    def push_messages(self, messages):
        messages = list(messages)
        for reply in self.held:  # held back one push: it arrives during the following batch
            self.ready[reply.metadata.reply_to_message_id] = reply
        self.held = []
        for msg, reply in zip(messages, self.inner.send_and_receive(messages), strict=True):
            cid = self.inner.client_of(msg.metadata.dst_node_id)
            if cid in self.slow and msg.metadata.message_type != "query":
                self.held.append(reply)
            else:
                self.ready[reply.metadata.reply_to_message_id] = reply
        return [m.metadata.message_id for m in messages]

    def pull_messages(self, message_ids):
        ids = set(message_ids)
        self.pulled_ids.append(ids)
        return [self.ready.pop(i) for i in list(self.ready) if i in ids]


def test_a_slow_clients_reply_is_refused_logged_and_listed_in_the_next_round(
    compose, tiny_overrides, monkeypatch, caplog
):
    monkeypatch.setattr(messaging, "REPLY_POLL_S", 0.01)
    cfg = compose(*tiny_overrides, "method=fedavg", "fraction=1.0")
    strategy = build(cfg, run_token="test-run")
    grid = PushPullGrid(InProcessGrid(4), slow={2})
    records = []
    with caplog.at_level(logging.WARNING):
        strategy.start(grid, num_rounds=3, timeout=0.2, on_round=records.append)
    for r in records:  # every round closes at its timeout with the three others; 2 never counts
        assert sorted(r["clients"]) == [0, 1, 3], r
        assert [d["client"] for d in r["dropped"]] == [2]
        assert r["dropped"][0]["reason"] == "no reply before the round timeout"
    assert "late_replies" not in records[0]
    for rnd in (2, 3):  # round r - 1's reply of client 2 arrives while round r runs
        late = records[rnd - 1]["late_replies"]
        assert [(x["client"], x["round"]) for x in late] == [(2, rnd - 1)]
        assert late[0]["node"] == grid.inner.node_of_client[2] and late[0]["late_s"] >= 0
    assert "late reply of client 2 to round 1" in caplog.text and "refused, not aggregated" in caplog.text


def _sent(mid: str, client: int, server_round: int, node: int, created: float, ttl: float) -> Message:
    config = ConfigRecord({wire.CLIENT_KEY: client, wire.ROUND_KEY: server_round})
    msg = Message(content=RecordDict({wire.CONFIG_RECORD: config}), message_type="train", dst_node_id=node, ttl=ttl)
    msg.metadata.__dict__["_message_id"] = mid
    msg.metadata.__dict__["_created_at"] = created
    return msg


def _reply_to(msg: Message) -> Message:
    return Message(RecordDict(), reply_to=msg)


def test_late_replies_are_watched_until_their_message_expires(serverapp_identity):
    late = LateReplies()
    a = _sent("a", client=5, server_round=3, node=105, created=100.0, ttl=70.0)  # expires at 170
    b = _sent("b", client=6, server_round=3, node=106, created=100.0, ttl=20.0)  # expires at 120
    late.give_up(["a", "b"], {"a": a, "b": b}, now=110.0)
    assert late.watched(now=115.0) == {"a", "b"}
    assert late.watched(now=125.0) == {"a"}  # b's message is gone at the SuperLink: not pulled again
    fresh = _sent("c", client=7, server_round=4, node=107, created=125.0, ttl=70.0)
    kept = late.sort_out([_reply_to(a), _reply_to(fresh)], now=130.5)
    assert [m.metadata.reply_to_message_id for m in kept] == ["c"]  # the late one is kept out
    assert late.take() == [{"client": 5, "round": 3, "node": 105, "late_s": 20.5}]
    assert late.take() == [] and late.watched(now=131.0) == set()


def test_an_error_in_place_of_a_late_reply_is_not_a_late_reply(serverapp_identity):
    from flwr.app import Error

    late = LateReplies()
    a = _sent("a", client=5, server_round=3, node=105, created=100.0, ttl=70.0)
    late.give_up(["a"], {"a": a}, now=110.0)
    error = Message(Error(code=0, reason="Node Unavailable"), reply_to=a)
    assert late.sort_out([error], now=111.0) == []
    assert late.take() == [] and late.watched(now=112.0) == set()
