"""What a user sees when a run cannot start: one line naming the setting and its fix.

Config, checkpoint and federation errors are the user's to fix, so each is one ``pflower: ...``
line: exit status 2 under ``pflower sim``; under ``flwr run`` the ServerApp logs the line (it
reaches ``flwr run --stream`` and ``flwr log``) and the run ends as failed, while Flower's own
"ServerApp raised an exception" traceback for that error is dropped. A run that stops before its
first round is recorded leaves no run directory behind (nothing in it could be resumed).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from logging import ERROR, WARNING
from pathlib import Path

from flwr.common import log
from flwr.supercore.logger import FLOWER_LOGGER

from strategies.base import FederationError
from strategies.checkpoint import CheckpointError

from .config import ConfigError

USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, CheckpointError, FederationError)


class _DropUserErrorTraceback(logging.Filter):
    """Flower logs a ServerApp's exception with its traceback; a user error was already logged as one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, USER_ERRORS)


_FILTER = _DropUserErrorTraceback()


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Log a user error as one ``pflower:`` line and re-raise it (so the run ends as failed)."""
    try:
        yield
    except USER_ERRORS as exc:
        log(ERROR, "pflower: %s", exc)
        if _FILTER not in FLOWER_LOGGER.filters:
            FLOWER_LOGGER.addFilter(_FILTER)
        raise


def discard_unstarted_run(run_dir: Path) -> None:
    """Remove a fresh run directory whose run stopped before round 1 was recorded (and its date
    folder if that is left empty): it holds only the config and provenance, nothing to resume."""
    if (run_dir / "metrics.jsonl").exists():
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    try:
        run_dir.parent.rmdir()
    except OSError:
        pass
    log(WARNING, "pflower: removed %s: the run stopped before its first round", run_dir)
