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

from pflower.compat import FLOWER_LOGGER
from pflower.strategies.base.checkpoint import CheckpointError
from pflower.strategies.base.client_directory import FederationError

from .config import ConfigError

USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, CheckpointError, FederationError)


class _DropUserErrorTraceback(logging.Filter):
    """Flower logs a ServerApp's exception with its traceback; a user error was already logged as
    one line. Its exit message then calls any failure "an unhandled exception"; after a user error
    that sentence is replaced by what happened (the exit code stays: the run failed)."""

    def __init__(self) -> None:
        super().__init__()
        self.user_error = False

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else getattr(record, "pflower_user_error", None)
        if isinstance(exc, USER_ERRORS):
            return False
        if self.user_error and isinstance(record.msg, str) and record.msg.startswith("Exit Code:"):
            code = record.msg.split("\n", 1)[0]
            record.msg, record.args = f"{code}\n{USER_ERROR_EXIT}", ()
        return True


# what the exit message of a run stopped by a user error says instead of Flower's generic text
USER_ERROR_EXIT = (
    "pflower stopped the run on the setting named in the `pflower:` line above "
    "(nothing to debug: fix it and run again)."
)


_FILTER = _DropUserErrorTraceback()


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Log a user error as one ``pflower:`` line and re-raise it (so the run ends as failed)."""
    try:
        yield
    except USER_ERRORS as exc:
        log(ERROR, "pflower: %s", exc)
        _FILTER.user_error = True
        if _FILTER not in FLOWER_LOGGER.filters:
            FLOWER_LOGGER.addFilter(_FILTER)
        raise


def discard_unstarted_run(run_dir: Path, made_root: bool = False, quiet: bool = False) -> None:
    """Remove a fresh run directory whose run stopped before round 1 was recorded (and its date
    folder if that is left empty; ``made_root``: the output folder too, if this run created it and
    it is left empty): it holds only the config and provenance, nothing to resume. ``quiet``: the
    run was refused before it began (its one ``pflower:`` line says why), so no line of its own."""
    if (run_dir / "metrics.jsonl").exists():
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    for folder in (run_dir.parent, run_dir.parent.parent) if made_root else (run_dir.parent,):
        try:
            folder.rmdir()
        except OSError:
            break
    if not quiet:
        log(WARNING, "pflower: removed %s: the run stopped before its first round", run_dir)
