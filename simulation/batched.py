"""The batched engine of ``pflower sim`` (``backend=batched``): a round's sampled clients trained
as one computation, in this process.

Each train message is handled as on the serial engine up to training (the same ``prepare``,
state, received tensors and ``test_before``: :func:`client_app.runtime.start_train`) and after
it (``test_after``, what the client keeps, the reply: :func:`~client_app.runtime.finish_train`).
In between, the clients whose role describes this round's training as a
:class:`~client_app.roles.base.FitPlan` are grouped (same role, architecture, plan shape and
training arguments) and each group trains at once (:func:`client_app.grouped_training.train_together`):
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

import time
from logging import INFO
from typing import TYPE_CHECKING

from flwr.app import Message
from flwr.common import log

from pflower.client_app.grouped_training import evaluate_alone, evaluate_together, train_tasks
from pflower.client_app.runtime import TrainTask, finish_train, record_before, start_train

from .inprocess import InProcessGrid, _threads, error_reply, handle_safely

if TYPE_CHECKING:
    from .shared_trainer import SharedTrainer


class BatchedGrid(InProcessGrid):
    """The in-process Grid whose train messages run as batched groups (module docstring)."""

    def __init__(
        self,
        num_nodes: int,
        batch_clients: int = 64,
        threads: int | None = None,
        record: bool = False,
        batch_eval: bool | None = None,
        trainer: SharedTrainer | None = None,
    ):
        """``batch_clients``: the most clients prepared and trained at once; ``threads``: torch
        threads for everything this process computes (None: unchanged); ``batch_eval``: evaluate
        a chunk's models as one computation too (None: on CUDA only; on a CPU one at a time is
        faster, measured in docs/benchmarks.md section 5); ``trainer``: the training step this
        run shares with others (``pflower sim --together``, :mod:`simulation.together`)."""
        if isinstance(batch_clients, bool) or not isinstance(batch_clients, int) or batch_clients < 1:
            raise ValueError(f"batch_clients must be a positive whole number, got {batch_clients!r}")
        super().__init__(num_nodes, record=record, client_threads=threads)
        self.batch_clients = batch_clients
        self.batch_eval = batch_eval
        self.trainer = trainer
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
                started.append((i, start_train(msg, self.contexts[node], deferred=True)))
            except Exception as exc:  # noqa: BLE001 - a ClientApp exception becomes an error reply, as in Flower
                replies[i] = error_reply(msg, exc)
        befores = self._evaluate([task for _, task in started], [task.before for _, task in started])
        for (i, task), result in zip(started, befores):
            if isinstance(result, Exception):
                replies[i] = error_reply(tasks[i][0], result)
            else:
                record_before(task, result)
        started = [(i, task) for (i, task), result in zip(started, befores) if not isinstance(result, Exception)]
        ready = [task for _, task in started]
        outcomes = self.trainer.train(ready, self._say) if self.trainer else train_tasks(ready, self._say)
        trained = [(i, task, outcome) for (i, task), outcome in zip(started, outcomes)]
        for i, _, outcome in trained:
            if isinstance(outcome, Exception):
                replies[i] = error_reply(tasks[i][0], outcome)
        trained = [t for t in trained if not isinstance(t[2], Exception)]
        models = []
        for _, task, _ in trained:
            try:
                models.append(task.role.trained_model(task.job.model, task.job.ctx))
            except Exception as exc:  # noqa: BLE001 - finish_train asks again and replies the error
                models.append(exc)
        afters = self._evaluate([task for _, task, _ in trained], models)
        for (i, task, outcome), after in zip(trained, afters):
            after = None if isinstance(after, Exception) else after  # finish_train evaluates it alone, or fails
            msg, node = tasks[i]
            if task.batched:
                self.batched_clients += 1
            else:
                self.alone_clients += 1
            try:
                replies[i] = finish_train(task, self.contexts[node], outcome, after)
            except Exception as exc:  # noqa: BLE001 - as above
                replies[i] = error_reply(msg, exc)
        return replies  # type: ignore[return-value]

    def _evaluate(self, tasks: list[TrainTask], models: list) -> list:
        """Each task's model (an exception: passed on) evaluated on its client's test split and
        the seconds added to its evaluation time: with ``batch_eval``, the models of one
        architecture and device together (:func:`client_app.grouped_training.evaluate_together`, the
        seconds shared), else, or where a group's evaluation fails, one at a time, where a
        client's own exception is its result."""
        out: list = list(models)
        by_device: dict[str, list[int]] = {}
        for k, task in enumerate(tasks):
            if not isinstance(models[k], Exception):
                by_device.setdefault(str(task.job.ctx.device), []).append(k)
        for ks in by_device.values():
            device = tasks[ks[0]].job.ctx.device
            if self.batch_eval if self.batch_eval is not None else device.type == "cuda":
                t0 = time.perf_counter()
                data = [(tasks[k].job.data.x_test, tasks[k].job.data.y_test) for k in ks]
                try:
                    results = evaluate_together([models[k] for k in ks], data, device)
                except Exception:  # noqa: BLE001 - one client's model or data: one at a time finds whose
                    pass
                else:
                    share = (time.perf_counter() - t0) / len(ks)
                    for k, result in zip(ks, results):
                        out[k] = result
                        tasks[k].eval_s += share
                    continue
            for k in ks:
                out[k] = evaluate_alone(tasks[k], models[k])
        return out

    def _say(self, role: str, reason: str) -> None:
        if (role, reason) not in self.said:
            self.said.add((role, reason))
            log(INFO, "batched engine: role %s trains one client at a time: %s", role, reason)
