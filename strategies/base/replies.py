"""Reading a batch's replies: each one matched to the client that was asked (the round ledger),
checked against what that client may send (``validation.validate_reply``), and the rest named as
dropped: client errors, invalid replies (their bytes still counted), and clients that never
answered. The result never depends on the order the replies arrived in.

A batch in which every asked client's ClientApp failed (raised, crashed or could not load) stops
the run (:class:`ClientsFailed`): no client can make progress, and a run that went on would
write rounds of an untrained model as if they were results. A node that is unreachable or too
slow is dropped as before: that is the network's, and the next round may reach it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from logging import WARNING
from typing import Any

from flwr.app import Message
from flwr.common import log

from pflower.compat import ErrorCode
from pflower.models.schema import Template
from pflower.protocol.wire import WIRE_EXTRA_PREFIX

from .client_directory import ClientInfo, FederationError
from .round_ledger import RoundLedger
from .validation import ClientUpdate, InvalidReply, record_bytes, validate_reply

# the error codes of a ClientApp that ran (or was to run) and failed, as Flower's engines set them
CLIENT_APP_FAILED = (
    ErrorCode.LOAD_CLIENT_APP_EXCEPTION,
    ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
    ErrorCode.CLIENT_APP_CRASHED,
)


class ClientsFailed(FederationError):
    """Every client asked in a batch answered with a ClientApp failure: the run stops, as one
    line naming the round and the first client's error (each client's is logged above it)."""


def collect_replies(
    server_round: int,
    replies: Iterable[Message],
    task: str,
    ledger: RoundLedger,
    clients: Mapping[int, ClientInfo],
    expected_uploads: Callable[[int], list[Template]],
) -> tuple[list[ClientUpdate], list[dict[str, Any]]]:
    """Valid updates in client-id order and the dropped replies, for the batch in ``ledger``.
    ``expected_uploads(client_id)``: the key sets a reply may carry. A train reply also moves its
    client's ``state_round`` (it saved its state before it replied)."""
    updates: list[ClientUpdate] = []
    dropped: list[dict[str, Any]] = []
    answered: set[int] = set()
    failed: list[tuple[int | None, str]] = []  # ClientApp failures, in arrival order
    for msg in replies:
        node = msg.metadata.src_node_id
        cid = ledger.client_of(msg)
        if cid is not None:
            answered.add(cid)
        if msg.has_error():
            dropped.append({"client": cid, "reason": f"client error: {msg.error.reason}"})
            if msg.error.code in CLIENT_APP_FAILED:
                failed.append((cid, msg.error.reason))
            continue
        if cid is None:
            dropped.append({"client": None, "reason": f"reply from unexpected node {node}"})
            continue
        info = clients.get(cid)
        try:
            update = validate_reply(
                msg.content,
                node_id=node,
                expected_client=cid,
                expected_arrays=expected_uploads(cid),
                expected_train_size=info.num_train if info else None,
                expected_test_size=info.num_test if info else None,
            )
            extra = [k for k in update.arrays if k.startswith(WIRE_EXTRA_PREFIX)]
            update.extra = {k[len(WIRE_EXTRA_PREFIX) :]: update.arrays.pop(k) for k in extra}
            updates.append(update)
            if task == "train" and info is not None:  # it saved its state before it replied
                info.state_round = max(info.state_round, server_round)
        except InvalidReply as exc:
            # a rejected reply's arrays crossed the network all the same: they count in bytes_up
            nbytes = sum(record_bytes(r) for r in msg.content.array_records.values())
            dropped.append({"client": cid, "reason": str(exc), **({"bytes": nbytes} if nbytes else {})})
    for cid in ledger.asked():
        if cid not in answered:
            dropped.append({"client": cid, "reason": "no reply before the round timeout"})
    updates.sort(key=lambda u: u.client_id)
    dropped.sort(key=lambda d: (d["client"] is None, d["client"] if d["client"] is not None else 0))
    for d in dropped:
        log(WARNING, "round %d: dropped reply of client %s: %s", server_round, d["client"], d["reason"])
    asked = ledger.asked()
    if asked and not updates and len({cid for cid, _ in failed}) == len(asked):
        cid, reason = min(failed, key=lambda f: (f[0] is None, f[0] or 0))
        raise ClientsFailed(
            f"round {server_round}: the ClientApp of every client asked to {task} failed ({len(asked)} of "
            f"{len(asked)}; each error is logged above), e.g. client {cid}: {reason[:400]}. Fix the cause"
        )
    return updates, dropped
