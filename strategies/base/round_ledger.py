"""What the server sent in the round under way: who was asked, by which message, how many bytes
and which layer groups went down. One object with one :meth:`RoundLedger.reset`, so every path
that starts a batch of messages (a training round, a final evaluation, FedCPMD's probes) starts
from the same empty state."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from flwr.app import Message, Metadata


@dataclass
class RoundLedger:
    """The round's messages: ``inflight`` (node id -> client id), ``sent`` (client id -> the
    metadata of its message: the grid fills in its message id when it pushes, and an error reply
    the SuperLink writes itself, "Node Unavailable", names only that id), ``bytes_down`` (tensor
    bytes sent) and ``groups_down`` (layer groups sent)."""

    inflight: dict[int, int] = field(default_factory=dict)
    sent: dict[int, Metadata] = field(default_factory=dict)
    bytes_down: int = 0
    groups_down: set[str] = field(default_factory=set)

    def reset(self) -> None:
        """Forget the previous batch (a new round, the final evaluation, a probe)."""
        self.inflight, self.sent, self.bytes_down, self.groups_down = {}, {}, 0, set()

    def record(self, client_id: int, message: Message, nbytes: int, groups: Iterable[str]) -> None:
        """``message`` goes to ``client_id`` (its node is the message's destination) with ``nbytes``
        of tensors of ``groups``. Keeps the metadata, not the message: its arrays are freed once pushed."""
        self.inflight[message.metadata.dst_node_id] = client_id
        self.sent[client_id] = message.metadata
        self.bytes_down += nbytes
        self.groups_down.update(groups)

    def client_of(self, reply: Message) -> int | None:
        """The client a reply answers for: its source node's (a node answers for itself only: its
        id is authenticated), or for an error the SuperLink wrote from node 0, the client whose
        message it replies to."""
        cid = self.inflight.get(reply.metadata.src_node_id)
        if cid is None and reply.has_error():
            by_message = {meta.message_id: c for c, meta in self.sent.items() if meta.message_id}
            cid = by_message.get(reply.metadata.reply_to_message_id)
        return cid

    def only(self, client_id: int) -> RoundLedger:
        """A ledger of ``client_id``'s message alone (a relay round checks one reply at a time)."""
        return RoundLedger(
            inflight={n: c for n, c in self.inflight.items() if c == client_id},
            sent={c: m for c, m in self.sent.items() if c == client_id},
        )

    def asked(self) -> list[int]:
        """The clients asked in this batch."""
        return list(self.inflight.values())
