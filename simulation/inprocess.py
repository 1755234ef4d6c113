"""An in-process Grid: messages go straight to the ClientApp handlers, in this process, no Ray.

Each node keeps its own Context (node config + state) across rounds, like a SuperNode. The
strategy's messages are handled one after the other in the order they are sent (client-id
order), so a run is deterministic and a debugger sees both sides. The tests and the
communication benchmark run on it. For tests, nodes can be removed, made to fail, answered for
by the "SuperLink" ("Node Unavailable"), or have their replies tampered with.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable

import numpy as np
from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid

from pflower.client_app.runtime import handle_evaluate, handle_hello, handle_train
from pflower.client_app.state import context_versions
from pflower.compat import ErrorCode, TaskIdentity, node_unavailable_reason

HANDLERS = {"query": handle_hello, "train": handle_train, "evaluate": handle_evaluate}
Tamper = Callable[[Message], Message]


class InProcessGrid(Grid):
    """A Grid whose nodes are ClientApp handlers in this process (one Context per node)."""

    # pflower's handlers answer discovery as a query message (a Flower ClientApp is asked with a
    # train message first: ClientDirectory.query)
    discovery_type = "query"

    def __init__(
        self,
        num_nodes: int,
        node_config: dict | None = None,
        first_node_id: int = 1000,
        record: bool = True,
        client_threads: int | None = None,
    ) -> None:
        """``record``: keep every message sent and received in ``sent``/``replies`` (tests); the
        serial backend of ``pflower sim`` runs without, so a long run does not hold every round's arrays.
        ``client_threads``: torch threads while a client handles a message (the server's own
        computation keeps the process's setting). 1 is what a Ray actor with one CPU uses, and
        the thread count changes float sums: with it both backends write the same numbers."""
        self.record = record
        self.client_threads = client_threads
        TaskIdentity.run_id = 1  # what a ServerApp process has set when a strategy builds Messages
        TaskIdentity.node_id = 0
        TaskIdentity.task_id = 0
        self.contexts: dict[int, Context] = {}
        self.node_of_client: dict[int, int] = {}
        self.sent: list[Message] = []
        self.replies: list[Message] = []
        self.tamper: dict[int, Tamper] = {}  # client id -> function applied to its train replies
        self.fail: set[int] = set()  # client ids whose handler raises
        self.unavailable: set[int] = set()  # client ids the SuperLink answers for ("Node Unavailable")
        for cid in range(num_nodes):
            self.add_node(cid, first_node_id + cid, node_config)

    def add_node(self, client_id: int, node_id: int, node_config: dict | None = None) -> None:
        config = {"partition-id": client_id, "num-partitions": len(self.contexts) + 1, **(node_config or {})}
        self.contexts[node_id] = Context(
            run_id=1, node_id=node_id, node_config=config, state=RecordDict(), run_config={}
        )
        self.node_of_client[client_id] = node_id
        total = len(self.contexts)
        for ctx in self.contexts.values():
            if "num-partitions" in ctx.node_config:
                ctx.node_config["num-partitions"] = total

    def remove_node(self, node_id: int) -> None:
        self.contexts.pop(node_id)

    # Grid API -----------------------------------------------------------------
    def set_run(self, run) -> None:  # noqa: ANN001
        pass

    @property
    def run(self):  # noqa: ANN201
        return None

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return Message(content=content, message_type=message_type, dst_node_id=dst_node_id, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError("InProcessGrid only supports send_and_receive")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError("InProcessGrid only supports send_and_receive")

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Every message's reply, in the order sent (a vanished node's message gets none)."""
        slots: list[
            Message | tuple[Message, int, int, Message | None]
        ] = []  # the SuperLink's answer, or (msg, node, cid, crash reply)
        for msg in messages:
            if self.record:
                self.sent.append(msg)
            node = msg.metadata.dst_node_id
            if node not in self.contexts:
                continue  # a vanished node never answers
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            msg.metadata.__dict__["_src_node_id"] = 0
            cid = self.client_of(node)
            if cid in self.unavailable:  # as flwr's linkstate does: an error reply from node 0
                reply = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason=node_unavailable_reason()), reply_to=msg)
                reply.metadata.__dict__["_src_node_id"] = 0
                slots.append(reply)
            else:
                crashed = cid in self.fail and msg.metadata.message_type != "query"
                slots.append(
                    (msg, node, cid, error_reply(msg, RuntimeError(f"client {cid} crashed")) if crashed else None)
                )
        handled = iter(self.handle_all([(s[0], s[1]) for s in slots if not isinstance(s, Message) and s[3] is None]))
        replies = []
        for slot in slots:
            if isinstance(slot, Message):
                reply = slot
            else:
                msg, node, cid, crash = slot
                reply = crash if crash is not None else next(handled)
                reply.metadata.__dict__["_src_node_id"] = node
                if msg.metadata.message_type == "train" and cid in self.tamper:
                    reply = self.tamper[cid](reply)
            if self.record:
                self.replies.append(reply)
            replies.append(reply)
        return replies

    def client_of(self, node: int) -> int:
        config = self.contexts[node].node_config
        return int(config.get("client-id", config.get("partition-id")))

    def handle_all(self, tasks: list[tuple[Message, int]]) -> list[Message]:
        """The replies to ``(message, node)`` tasks, in order: here one after the other in this
        process (``simulation.parallel`` overrides this to spread them over worker processes)."""
        return [handle_safely(msg, self.contexts[node], self.client_threads) for msg, node in tasks]

    def close(self) -> None:
        """Release what the grid holds (nothing here; the parallel engine's workers)."""


def error_reply(msg: Message, exc: BaseException) -> Message:
    """A ClientApp exception as the error reply Flower sends for it."""
    return Message(
        Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg
    )


def handle_safely(msg: Message, ctx: Context, threads: int | None) -> Message:
    """The handler's reply to ``msg`` on ``ctx`` (updated in place), or its exception as an
    error reply, as in Flower; with ``threads`` torch threads while it runs."""
    try:
        with _threads(threads):
            return HANDLERS[msg.metadata.message_type](msg, ctx)
    except Exception as exc:  # noqa: BLE001 - a ClientApp exception becomes an error reply, as in Flower
        return error_reply(msg, exc)


def _threads(n: int | None):  # noqa: ANN202
    """Run with ``n`` torch threads (None: unchanged), then restore the process's setting."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def scope():  # noqa: ANN202
        before = torch.get_num_threads()
        if n is not None:
            torch.set_num_threads(n)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    return scope()


def personal_state(context: Context) -> dict[str, np.ndarray] | None:
    """A node's newest saved personal state (None before it first trained)."""
    saves = context_versions(context)
    return {k: v.numpy() for k, v in saves[max(saves)].items()} if saves else None
