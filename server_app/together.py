"""``pflower sim -m ... backend=batched --together``: a sweep's runs in one process, each round's
training of all of them as one computation.

Each run keeps everything of its own: config, seed, strategy, clients' state, run directory,
checkpoints (each resumes alone with ``resume=``). What they share is the batched engine's
training step: every run's :class:`~server_app.batched.BatchedGrid` hands its chunk of prepared
clients to one :class:`SharedTrainer`, which waits until every run still going has handed in
its chunk (or ended), then trains all of them with one
:func:`client_app.batched.train_tasks` call, where clients of the same role, architecture and
training arguments form one group whichever run they belong to: three seeds of a method train
as one computation three times as wide.

The runs take turns: a run computes only while it holds the trainer's lock, and gives it up only
while it waits for the joint training. So no two runs ever compute at the same time, the order
of everything inside a run is the one it has alone, and a run's numbers equal its numbers on the
batched engine alone up to the float rounding of a wider group (the tolerance of
tests/pinned/test_batched_engine.py; tested). A chunk of every run is in memory at once: up to
``batch_clients`` clients per run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from logging import INFO
from typing import Any

from flwr.common import log
from omegaconf import DictConfig

from pflower.client_app.batched import train_tasks
from pflower.client_app.runtime import TrainTask

Say = Callable[[str, str], None]


class SharedTrainer:
    """The joint training step of ``runs`` runs (module docstring). Every method is called with
    :attr:`lock` held; :meth:`train` gives it up while it waits."""

    def __init__(self, runs: int) -> None:
        if runs < 1:
            raise ValueError(f"a shared trainer needs at least one run, got {runs}")
        self.lock = threading.Condition()
        self._active = runs
        self._pending: dict[int, list[TrainTask]] = {}
        self._results: dict[int, list[float | Exception]] = {}
        self._next = 0
        self._say: Say | None = None
        self.widths: list[int] = []  # clients per joint training (tests, the log)

    def train(self, tasks: list[TrainTask], say: Say) -> list[float | Exception]:
        """Hand in one run's prepared clients; returns their outcomes (as ``train_tasks`` does)
        once every run still going has handed in a chunk and all were trained together."""
        key, self._next = self._next, self._next + 1
        self._pending[key] = tasks
        self._say = self._say or say
        self._train_if_all_in()
        while key not in self._results:
            self.lock.wait()
        return self._results.pop(key)

    def leave(self) -> None:
        """A run ended (finished or failed): the others no longer wait for it."""
        self._active -= 1
        self._train_if_all_in()

    def _train_if_all_in(self) -> None:
        if not self._pending or len(self._pending) < self._active:
            return
        chunks = list(self._pending.items())
        self._pending.clear()
        joint = [task for _, tasks in chunks for task in tasks]
        try:
            outcomes: list[float | Exception] = train_tasks(joint, self._say or (lambda role, reason: None))
        except Exception as exc:  # noqa: BLE001 - every waiting run gets its clients' error replies, none hangs
            outcomes = [exc] * len(joint)
        self.widths.append(len(joint))
        start = 0
        for key, tasks in chunks:
            self._results[key] = outcomes[start : start + len(tasks)]
            start += len(tasks)
        self.lock.notify_all()


class _RunLabels(logging.Filter):
    """Each run's log lines start with its label (``[seed=2] [round 3/100] ...``): the runs'
    lines interleave in one log."""

    def __init__(self, labels: dict[str, str]) -> None:
        super().__init__()
        self.labels = labels

    def filter(self, record: logging.LogRecord) -> bool:
        label = self.labels.get(threading.current_thread().name)
        if label:
            record.msg = f"[{label}] {record.msg}"
        return True


def run_together(cfgs: Sequence[DictConfig], labels: Sequence[str] | None = None) -> list[dict[str, Any] | Exception]:
    """Run every composed config (each ``backend=batched``) at once, their training shared
    (module docstring); each run's summary, or the exception that ended it."""
    from .batched import BatchedGrid
    from .config import ConfigError, resolve_workers
    from .runner import prepare_run, run_experiment

    wrong = [i for i, cfg in enumerate(cfgs) if cfg.get("backend") != "batched"]
    if wrong:
        raise ConfigError(
            "--together trains a sweep's runs as one computation on the batched engine: add backend=batched"
        )
    labels = list(labels or [f"run {k + 1}" for k in range(len(cfgs))])
    prepared = [prepare_run(cfg) for cfg in cfgs]  # every run refused or ready before any starts
    trainer = SharedTrainer(len(prepared))
    out: list[dict[str, Any] | Exception] = [RuntimeError("did not run")] * len(prepared)

    def one(k: int) -> None:
        cfg = prepared[k].plan.cfg
        threads = resolve_workers(cfg.get("workers", "auto"))
        with trainer.lock:
            try:
                grid = BatchedGrid(int(cfg.num_clients), int(cfg.get("batch_clients", 64)), threads, trainer=trainer)
                try:
                    out[k] = run_experiment(grid, prepared[k])
                finally:
                    grid.close()
            except Exception as exc:  # noqa: BLE001 - this run's failure; the others go on
                log(INFO, "together: %s ended with %s: %s", labels[k], type(exc).__name__, exc)
                out[k] = exc
            finally:
                trainer.leave()

    log(INFO, "together: %d runs, each round's training as one computation: %s", len(cfgs), "; ".join(labels))
    workers = [threading.Thread(target=one, args=(k,), name=f"pflower-together-{k}") for k in range(len(cfgs))]
    labelled = _RunLabels({w.name: labels[k] for k, w in enumerate(workers)})
    flower_logger = logging.getLogger("flwr")
    flower_logger.addFilter(labelled)
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        flower_logger.removeFilter(labelled)
    widths = trainer.widths
    if widths:
        log(INFO, "together: %d joint trainings, %d to %d clients each", len(widths), min(widths), max(widths))
    return out
