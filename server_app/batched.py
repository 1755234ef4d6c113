"""The batched engine of ``pflower sim`` (``backend=batched``): a round's sampled clients trained
as one computation, in this process.

Each train message is handled as on the serial engine up to training (the same ``prepare``,
state, received tensors and ``test_before``: :func:`client_app.runtime.start_train`) and after
it (``test_after``, what the client keeps, the reply: :func:`~client_app.runtime.finish_train`).
In between, the clients whose role describes this round's training as a
:class:`~client_app.roles.base.FitPlan` are grouped (same role, architecture, plan shape and
training arguments) and each group trains at once (:func:`client_app.batched.train_together`):
stacked parameters, ``torch.func.vmap``. A client whose role has no plan this round, or a group
that cannot run as one computation (an optimizer other than SGD, a model with dropout), trains
on its own, and the log says so once per role and reason. Messages other than train (discovery,
evaluation) are handled one by one, as on the serial engine.

Memory: at most ``batch_clients`` clients are prepared, trained and answered at a time, so a
round of 1,000 clients holds ``batch_clients`` models and their stacked copies, not 1,000.

Numbers: equal to the other engines' up to float rounding (sums in another order), not bit for
bit; tests/pinned/test_batched_engine.py states the tolerance. Every pinned number and committed
result comes from the other engines.
"""

from __future__ import annotations

from logging import INFO

from flwr.app import Message
from flwr.common import log

from pflower.client_app.batched import train_tasks
from pflower.client_app.runtime import TrainTask, finish_train, start_train

from .inprocess import InProcessGrid, _threads, error_reply, handle_safely


class BatchedGrid(InProcessGrid):
    """The in-process Grid whose train messages run as batched groups (module docstring)."""

    def __init__(self, num_nodes: int, batch_clients: int = 64, threads: int | None = None, record: bool = False):
        """``batch_clients``: the most clients prepared and trained at once; ``threads``: torch
        threads for everything this process computes (None: unchanged)."""
        if isinstance(batch_clients, bool) or not isinstance(batch_clients, int) or batch_clients < 1:
            raise ValueError(f"batch_clients must be a positive whole number, got {batch_clients!r}")
        super().__init__(num_nodes, record=record, client_threads=threads)
        self.batch_clients = batch_clients
        self.said: set[tuple[str, str]] = set()  # (role, reason) already logged
        self.batched_clients = 0  # clients trained inside a group (tests, the benchmark)
        self.alone_clients = 0  # clients trained one at a time
        threads_text = f"{threads} torch threads" if threads else "the process's torch threads"
        log(INFO, "batched engine: up to %d clients as one computation, %s", batch_clients, threads_text)

    def handle_all(self, tasks: list[tuple[Message, int]]) -> list[Message]:
        replies: list[Message | None] = [None] * len(tasks)
        train = [i for i, (msg, _) in enumerate(tasks) if msg.metadata.message_type == "train"]
        for i, (msg, node) in enumerate(tasks):
            if msg.metadata.message_type != "train":
                replies[i] = handle_safely(msg, self.contexts[node], self.client_threads)
        with _threads(self.client_threads):
            for start in range(0, len(train), self.batch_clients):
                chunk = train[start : start + self.batch_clients]
                for i, reply in zip(chunk, self._train_chunk([tasks[i] for i in chunk])):
                    replies[i] = reply
        return replies  # type: ignore[return-value]

    def _train_chunk(self, tasks: list[tuple[Message, int]]) -> list[Message]:
        """Prepare and evaluate every client of the chunk, train them (grouped where their roles
        allow), then evaluate, persist and reply for each; a client's exception is its error reply."""
        replies: list[Message | None] = [None] * len(tasks)
        started: list[tuple[int, TrainTask]] = []
        for i, (msg, node) in enumerate(tasks):
            try:
                started.append((i, start_train(msg, self.contexts[node])))
            except Exception as exc:  # noqa: BLE001 - a ClientApp exception becomes an error reply, as in Flower
                replies[i] = error_reply(msg, exc)
        outcomes = train_tasks([task for _, task in started], self._say)
        for (i, task), outcome in zip(started, outcomes):
            msg, node = tasks[i]
            if isinstance(outcome, Exception):
                replies[i] = error_reply(msg, outcome)
                continue
            if task.batched:
                self.batched_clients += 1
            else:
                self.alone_clients += 1
            try:
                replies[i] = finish_train(task, self.contexts[node], outcome)
            except Exception as exc:  # noqa: BLE001 - as above
                replies[i] = error_reply(msg, exc)
        return replies  # type: ignore[return-value]

    def _say(self, role: str, reason: str) -> None:
        if (role, reason) not in self.said:
            self.said.add((role, reason))
            log(INFO, "batched engine: role %s trains one client at a time: %s", role, reason)
