"""Who takes part: the connected nodes mapped to stable client ids, and what each announced.

A SuperNode that restarts comes back under a new node id; the server keys everything by the
client id the node's ClientApp reports in its hello (``partition-id`` in simulation, ``client-id``
in deployment), never by the node id. New nodes are asked with a ``query`` message; the reply
names the client, the sizes of its splits, the newest round whose state it holds and, when its
node config names one, the architecture it runs (which the strategy accepts or refuses).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from logging import WARNING
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from pflower.protocol import wire
from pflower.protocol.wire import TaskSpec

from .messaging import TTL_MARGIN_S, send_and_receive


class FederationError(RuntimeError):
    """The federation cannot run this config (its node count, every node refusing): the message
    names the setting to change. The ServerApp reports it as one line, like a config error."""

    user_error = True  # in a user's own ServerApp too: one `pflower:` line in Flower's log (pflower.logs)


@dataclass
class ClientInfo:
    """What the server knows of one client: where it is now and what it announced."""

    node_id: int
    num_train: int
    num_test: int
    state_round: int = 0  # the newest round whose state the client holds for this run (0: none)
    origin: dict[str, Any] | None = None  # its node's data directory's description (dataset=local)


class ClientStateLost(FederationError):
    """Clients that trained before a resumed run's checkpoint no longer hold their state."""


class ClientDirectory:
    """The run's clients (``clients``: client id -> :class:`ClientInfo`), kept current by
    :meth:`discover`. ``accept_model(client_id, announced)`` takes a node's announced
    architecture, or returns why it is refused."""

    def __init__(
        self, num_clients: int, discover_timeout: float, accept_model: Callable[[int, str | None], str | None]
    ) -> None:
        self.num_clients = num_clients
        self.discover_timeout = discover_timeout
        self.accept_model = accept_model
        self.clients: dict[int, ClientInfo] = {}

    def discover(self, grid: Grid, hello: TaskSpec, wait_for: int, timeout: float) -> None:
        """Map connected nodes to stable client ids (a restarted SuperNode gets a new node id).

        New nodes are asked who they are with a query message; each replies with its client
        id, the sizes of its splits and, if its node config names one, the architecture it runs.
        Waits until ``wait_for`` clients are known.
        """
        deadline = time.monotonic() + timeout
        errors: list[str] = []
        seen: set[int] = set()  # every node the SuperLink listed, answered or not
        while True:
            nodes = set(grid.get_node_ids())
            seen |= nodes
            for cid in [c for c, info in self.clients.items() if info.node_id not in nodes]:
                log(WARNING, "client %d (node %d) disconnected", cid, self.clients.pop(cid).node_id)
            known = {info.node_id for info in self.clients.values()}
            unknown = sorted(nodes - known)
            if unknown:
                new_errors = self.query(grid, unknown, hello)
                errors += new_errors
                if not self.clients and len(new_errors) >= len(unknown):
                    # every node refused (a config or data error is the same on all): fail now
                    raise FederationError(f"no client could join the run: {new_errors[0]}")
            if len(self.clients) >= wait_for or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        if not self.clients:
            raise FederationError(f"no client could join the run: {self.no_client_reason(errors, seen)}")
        if len(self.clients) < wait_for:
            log(WARNING, "only %d of %d clients connected; going on", len(self.clients), wait_for)

    def no_client_reason(self, errors: Sequence[str], seen: set[int]) -> str:
        """Why discovery found nobody, with what to try: a node's refusal, nodes that never answered
        within ``discover_timeout`` (a cold ClientApp imports torch and reads its data first), or no
        node at all."""
        if errors:
            return errors[0]
        if seen:
            return (
                f"{len(seen)} node(s) connected but none answered within discover_timeout="
                f"{self.discover_timeout:g} s (a cold ClientApp first imports torch and reads its data); "
                "raise discover_timeout (seconds, default 300) or check the SuperNodes' logs"
            )
        return (
            "no node connected; start the SuperNodes (flower-supernode) against this SuperLink, or "
            "raise discover_timeout (seconds, default 300) if they start later"
        )

    def ask(self, grid: Grid, node_ids: Sequence[int], hello: TaskSpec, message_type: str) -> list[tuple[int, Message]]:
        """Send the discovery spec to ``node_ids`` as ``message_type``; (asked node, reply) pairs."""
        config = ConfigRecord({wire.SPEC_KEY: hello.to_json(), wire.PLAIN_TASK: hello.task})
        messages = [
            Message(
                RecordDict({wire.CONFIG_RECORD: config}),
                message_type=message_type,
                dst_node_id=n,
                ttl=self.discover_timeout + TTL_MARGIN_S,
            )
            for n in node_ids
        ]
        replies = send_and_receive(grid, messages, self.discover_timeout)
        asked = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}  # ids set by the push
        # the SuperLink's own error replies come from node 0: name the node that was asked
        return [(asked.get(r.metadata.reply_to_message_id, r.metadata.src_node_id), r) for r in replies]

    def query(self, grid: Grid, node_ids: Sequence[int], hello: TaskSpec) -> list[str]:
        """Ask ``node_ids`` who they are; enter each valid answer; returns the refusals, one line each.

        The discovery spec (its task says ``query``) goes out as a train message: Flower runs a
        mod only in front of a function the ClientApp registers, and every ClientApp registers
        ``train`` (a Flower app of the user's own with :func:`pflower.client_app.client_mod`
        has no query function, and Flower logs a traceback for a message type nobody handles).
        A node that answers it with an error is asked again with a query message: a ClientApp
        written to the earlier contract answers that one. ``grid.discovery_type`` may name the
        first type (pflower's in-process engines, whose handlers take a query message)."""
        first = getattr(grid, "discovery_type", MessageType.TRAIN)
        answered = self.ask(grid, node_ids, hello, first)
        again = [node for node, reply in answered if reply.has_error()] if first != MessageType.QUERY else []
        first_error = {n: r.error.reason for n, r in answered if n in again}
        if again:
            answered = [(n, r) for n, r in answered if n not in again]
            answered += self.ask(grid, again, hello, MessageType.QUERY)
        errors = []
        for node, reply in answered:
            if reply.has_error():
                reason = foreign_clientapp(first_error.get(node), reply.error.reason) or reply.error.reason
                errors.append(f"node {node}: {reason}")
                log(WARNING, "node %d could not join: %s", node, reason)
                continue
            try:
                metrics = next(iter(reply.content.metric_records.values()))
                cid, n_train, n_test = (int(metrics[k]) for k in (wire.CLIENT_KEY, wire.NUM_TRAIN, wire.NUM_TEST))
                hello = reply.content.config_records.get(wire.HELLO_RECORD)
                announced = str(hello[wire.NODE_MODEL]) if hello is not None and wire.NODE_MODEL in hello else None
                state_round = int(metrics.get(wire.STATE_ROUND, 0))
                origin = (
                    json.loads(str(hello[wire.DATA_ORIGIN]))
                    if hello is not None and wire.DATA_ORIGIN in hello
                    else None
                )
                if origin is not None and not isinstance(origin, dict):
                    raise ValueError(f"{wire.DATA_ORIGIN} is not a JSON object")
            except (StopIteration, KeyError, TypeError, ValueError) as exc:
                errors.append(f"node {node}: malformed hello ({exc!r})")
                continue
            if wire.NUM_PARTITIONS in metrics and int(metrics[wire.NUM_PARTITIONS]) != self.num_clients:
                raise FederationError(
                    f"the simulation runs {int(metrics[wire.NUM_PARTITIONS])} SuperNodes but num_clients="
                    f'{self.num_clients}: run `flwr run . --federation-config "num-supernodes='
                    f'{self.num_clients}"` (or set num_clients={int(metrics[wire.NUM_PARTITIONS])})'
                )
            if not 0 <= cid < self.num_clients:
                errors.append(f"node {node}: client id {cid} outside 0..{self.num_clients - 1}")
                log(WARNING, "%s: set num_clients to the number of SuperNodes", errors[-1])
                continue
            refusal = self.accept_model(cid, announced)
            if refusal:
                errors.append(f"node {node}: {refusal}")
                log(WARNING, "node %d could not join: %s", node, refusal)
                continue
            if cid in self.clients:
                log(WARNING, "client %d moved from node %d to node %d", cid, self.clients[cid].node_id, node)
            self.clients[cid] = ClientInfo(node, n_train, n_test, state_round, origin)
        return errors


def foreign_clientapp(train_error: str | None, query_error: str) -> str | None:
    """Why a node cannot join when its ClientApp does not speak pflower's message contract, or None.

    Such an app (Flower's quickstart, no pflower mod) fails the discovery message in its own train
    function (``KeyError: 'arrays'``: pflower's message carries no model) and has no query function
    (Flower: "No query function registered"). Both errors are the user's code's, and neither names
    what to add; this says it."""
    if train_error is None or "No query function registered" not in query_error:
        return None
    return (
        "its ClientApp does not speak pflower's message contract (its own train function failed on pflower's "
        f"discovery message: {train_error[:200]}; it has no query function). Put pflower's mod in front of its "
        "functions, `ClientApp(mods=[pflower.client_app.client_mod(model=Net, data=load_data)])`, or build it "
        "with `pflower.client_app.build_clientapp(model=Net, data=load_data)` (docs/api.md)"
    )
