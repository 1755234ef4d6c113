"""The joint training step of ``--together`` runs (:mod:`simulation.together`): every run's
:class:`~simulation.batched.BatchedGrid` hands its chunk of prepared clients to one
:class:`SharedTrainer`, which trains every run's chunk in one :func:`client_app.grouped_training.train_tasks`
call. Its own module so that the batched engine and the together runner need not import each other.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pflower.client_app.grouped_training import train_tasks
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
