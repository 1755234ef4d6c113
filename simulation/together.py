"""``pflower sim -m ... backend=batched --together``: a sweep's runs in one process, each round's
training of all of them as one computation.

Each run keeps everything of its own: config, seed, strategy, clients' state, run directory,
checkpoints (each resumes alone with ``resume=``). What they share is the batched engine's
training step: every run's :class:`~simulation.batched.BatchedGrid` hands its chunk of prepared
clients to one :class:`SharedTrainer`, which waits until every run still going has handed in
its chunk (or ended), then trains all of them with one
:func:`client_app.grouped_training.train_tasks` call, where clients of the same role, architecture and
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
from collections.abc import Sequence
from logging import INFO
from typing import TYPE_CHECKING, Any

from flwr.common import log

from .shared_trainer import SharedTrainer

if TYPE_CHECKING:
    from pflower.server_app.run_plan import RunPlan


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


def run_together(plans: Sequence[RunPlan], labels: Sequence[str] | None = None) -> list[dict[str, Any] | Exception]:
    """Run every plan (each ``backend=batched``) at once, their training shared
    (module docstring); each run's summary, or the exception that ended it."""
    from pflower.server_app.config import ConfigError, resolve_workers
    from pflower.server_app.runner import prepare_run, run_experiment

    from .batched import BatchedGrid

    wrong = [i for i, plan in enumerate(plans) if plan.engine.backend != "batched"]
    if wrong:
        raise ConfigError(
            "--together trains a sweep's runs as one computation on the batched engine: add backend=batched"
        )
    labels = list(labels or [f"run {k + 1}" for k in range(len(plans))])
    prepared = [prepare_run(plan) for plan in plans]  # every run refused or ready before any starts
    trainer = SharedTrainer(len(prepared))
    out: list[dict[str, Any] | Exception] = [RuntimeError("did not run")] * len(prepared)

    def one(k: int) -> None:
        plan = prepared[k].plan
        threads = resolve_workers(plan.engine.workers)
        with trainer.lock:
            try:
                grid = BatchedGrid(plan.run.num_clients, plan.engine.batch_clients, threads, trainer=trainer)
                try:
                    out[k] = run_experiment(grid, prepared[k])
                finally:
                    grid.close()
            except Exception as exc:  # noqa: BLE001 - this run's failure; the others go on
                log(INFO, "together: %s ended with %s: %s", labels[k], type(exc).__name__, exc)
                out[k] = exc
            finally:
                trainer.leave()

    log(INFO, "together: %d runs, each round's training as one computation: %s", len(plans), "; ".join(labels))
    workers = [threading.Thread(target=one, args=(k,), name=f"pflower-together-{k}") for k in range(len(plans))]
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
