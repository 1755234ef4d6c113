"""``self.clients``: the connected clients, and a batch of messages of a method's own (a part of the
strategy base)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from flwr.app import Message, MessageType
from flwr.serverapp import Grid

from .client_directory import ClientDirectory, ClientInfo
from .messaging import send_and_receive
from .round_ledger import RoundLedger
from .validation import ClientUpdate


class Sender(Protocol):
    """What a batch of a method's own needs from the strategy: its message builder and checks."""

    ledger: RoundLedger

    def build_message(
        self, client_id: int, server_round: int, task: str, message_type: str, down: Any, extra: Any
    ) -> Message:
        """One message of ``task`` for ``client_id``, entered in the ledger."""
        ...

    def collect_replies(self, server_round: int, replies: Any, task: str) -> tuple[list[ClientUpdate], list[dict]]:
        """The valid updates to the ledger's batch, in client-id order, and the dropped replies."""
        ...


class Clients(Mapping[int, ClientInfo]):
    """The connected clients by client id (``self.clients[cid].num_train``, ``cid in
    self.clients``), kept current by discovery at the start of every round; and
    :meth:`exchange`, a batch of train messages a method sends before its round's own."""

    def __init__(self, directory: ClientDirectory, sender: Sender) -> None:
        self._directory = directory
        self._sender = sender
        self.grid: Grid | None = None  # the round's grid (set by the base as each round starts)
        self.timeout: float | None = None  # the wait for a batch's replies (the round timeout)
        self._bytes_down = 0  # what exchange() sent, counted in the coming round's bytes_down

    def __getitem__(self, client_id: int) -> ClientInfo:
        return self._directory.clients[client_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._directory.clients)

    def __len__(self) -> int:
        return len(self._directory.clients)

    def exchange(
        self, client_ids: Sequence[int], server_round: int, down: Mapping[int, Mapping[str, np.ndarray]]
    ) -> list[ClientUpdate]:
        """Send ``client_ids`` a train message each, carrying ``down[cid]``, and wait for the
        replies: the valid updates, in client-id order (invalid or missing replies are dropped).
        Called from :meth:`MethodHooks.prepare_round` (FedCPMD probes its new clients); the bytes
        sent count in the round's ``bytes_down``."""
        if self.grid is None:
            raise RuntimeError("clients.exchange() sends within a round: call it from prepare_round()")
        s = self._sender
        ledger, s.ledger = s.ledger, RoundLedger()
        try:
            messages = [s.build_message(c, server_round, "train", MessageType.TRAIN, down[c], {}) for c in client_ids]
            updates, _ = s.collect_replies(server_round, send_and_receive(self.grid, messages, self.timeout), "train")
            self._bytes_down += s.ledger.bytes_down
        finally:
            s.ledger = ledger
        return updates

    def take_bytes_down(self) -> int:
        """What :meth:`exchange` sent since the last call (the base adds it to the round's count)."""
        sent, self._bytes_down = self._bytes_down, 0
        return sent
