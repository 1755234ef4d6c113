"""How the server talks to the grid: push, then pull replies until all are in or the time is up.

A reply that comes after the server stopped waiting for it (a slow device, one back from an
outage within the message's time to live) is refused: it is never aggregated, its arrival is
logged with the client, the round it answers and how late it is, and the record of the round
it came in lists it (``late_replies``). The ids the server gave up on are pulled with every later batch
until the SuperLink drops their messages (the TTL); after that the SuperLink itself refuses
the reply ("The message it replies to ... has expired", in its log).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from logging import WARNING
from typing import Any

from flwr.app import Message
from flwr.common import log
from flwr.serverapp import Grid

from pflower.protocol import wire

# seconds a message outlives the wait for its reply: the SuperLink then drops it, so a SuperNode
# that reconnects after its round closed is not handed training whose reply would be discarded
TTL_MARGIN_S = 60.0
# How often the ServerApp asks the SuperLink for replies (seconds). Flower's own send_and_receive
# waits several times longer between pulls, so a deployment round idled after its last reply; a
# pull is one small request to the SuperLink (docs/deployment.md, "What a round costs").
REPLY_POLL_S = 0.5


@dataclass(frozen=True)
class GaveUp:
    """A message whose reply the server stopped waiting for."""

    client: int | None
    server_round: int | None
    node: int
    closed: float  # time.time() when the wait ended
    expires: float  # when the SuperLink drops the message (its TTL): no reply can come after


class LateReplies:
    """Per grid: the messages given up on, and the late replies that came for them since the
    last :meth:`take`."""

    def __init__(self) -> None:
        self.waiting: dict[str, GaveUp] = {}
        self.arrived: list[dict[str, Any]] = []

    def give_up(self, message_ids: Iterable[str], sent: dict[str, Message], now: float) -> None:
        """Remember the messages still unanswered when a wait ended."""
        for mid in message_ids:
            msg = sent[mid]
            config = msg.content.config_records.get(wire.CONFIG_RECORD, {})
            ttl = msg.metadata.ttl or 0.0
            self.waiting[mid] = GaveUp(
                client=_int_or_none(config.get(wire.CLIENT_KEY)),
                server_round=_int_or_none(config.get(wire.ROUND_KEY)),
                node=msg.metadata.dst_node_id,
                closed=now,
                expires=msg.metadata.created_at + ttl if ttl else now,
            )

    def watched(self, now: float) -> set[str]:
        """The ids still worth pulling (their message has not expired at the SuperLink)."""
        for mid in [m for m, g in self.waiting.items() if g.expires <= now]:
            del self.waiting[mid]
        return set(self.waiting)

    def sort_out(self, got: Iterable[Message], now: float) -> list[Message]:
        """Split a pull: replies to given-up messages are logged and kept out; the rest returned."""
        fresh: list[Message] = []
        for msg in got:
            gave_up = self.waiting.pop(msg.metadata.reply_to_message_id, None)
            if gave_up is None:
                fresh.append(msg)
            elif not msg.has_error():  # an error in its place (node gone, expired) is no reply
                late = {
                    "client": gave_up.client,
                    "round": gave_up.server_round,
                    "node": gave_up.node,
                    "late_s": round(now - gave_up.closed, 1),
                }
                self.arrived.append(late)
                log(
                    WARNING,
                    "late reply of client %s to round %s (node %d) came %.1f s after the server stopped "
                    "waiting for it: refused, not aggregated",
                    late["client"],
                    late["round"],
                    late["node"],
                    late["late_s"],
                )
        return fresh

    def take(self) -> list[dict[str, Any]]:
        """The late replies since the last call (the run loop adds them to the round's record)."""
        arrived, self.arrived = self.arrived, []
        return arrived


_LATE: weakref.WeakKeyDictionary[Any, LateReplies] = weakref.WeakKeyDictionary()


def late_replies(grid: Grid) -> LateReplies:
    """The :class:`LateReplies` of ``grid`` (one per grid, made on first use)."""
    try:
        return _LATE.setdefault(grid, LateReplies())
    except TypeError:  # a grid that cannot be weakly referenced: nothing is remembered
        return LateReplies()


# set by the first Ctrl-C (server_app.interrupt): a ServerApp that runs off the main thread, as
# Flower's simulation engine runs it, stops at its next poll for replies instead of waiting out the
# round timeout for ClientApps the Ctrl-C already ended
STOP = threading.Event()


def send_and_receive(grid: Grid, messages: Iterable[Message], timeout: float | None) -> list[Message]:
    """Flower's ``Grid.send_and_receive`` (push, then pull until every reply is in or the
    timeout passes), polling every :data:`REPLY_POLL_S`; replies to messages an earlier wait
    gave up on are refused and logged (:class:`LateReplies`). Grids that only deliver
    synchronously (the in-process grid) keep their own."""
    messages = list(messages)
    try:
        ids: list[str] | None = list(grid.push_messages(messages))
    except NotImplementedError:
        ids = None
    if ids is None:  # outside the except: a client's failure is not chained to this fallback
        return list(grid.send_and_receive(messages, timeout=timeout))
    sent = dict(zip(ids, messages, strict=True))
    pending = set(ids)
    late = late_replies(grid)
    end = time.time() + (timeout if timeout is not None else 0.0)
    replies: list[Message] = []
    while timeout is None or time.time() < end:
        if STOP.is_set():  # Ctrl-C while this ServerApp runs off the main thread (Flower's simulation engine)
            raise KeyboardInterrupt
        got = late.sort_out(grid.pull_messages(pending | late.watched(time.time())), time.time())
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        if not pending:
            break
        time.sleep(REPLY_POLL_S)
    late.give_up(pending, sent, time.time())
    return replies


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
