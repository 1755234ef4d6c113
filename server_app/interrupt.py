"""Ctrl-C: the first stops the run where it stands, keeps its last checkpoint and says how to go on;
a second exits at once.

Python turns the first SIGINT into a ``KeyboardInterrupt`` in the main thread. The engines let it
pass (the parallel engine ends its worker processes first: they ignore SIGINT, so a Ctrl-C that
reaches the whole process group does not print a traceback per worker), the runner turns it into a
:class:`RunInterrupted` naming the run directory and the last checkpointed round, and the command
prints one line and exits 130 (128 + SIGINT, what a shell reports for a process Ctrl-C ended).
While the run winds down, a second Ctrl-C ends this process and its children at once.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pflower.strategies.base.checkpoint import checkpointed_round
from pflower.strategies.base.messaging import STOP

__all__ = ["EXIT_INTERRUPTED", "RunInterrupted", "checkpointed_round", "ctrl_c_stops_the_run", "interrupted_line"]

EXIT_INTERRUPTED = 130  # 128 + SIGINT


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: where it stopped (``run_dir``) and the round its checkpoint holds (None: none)."""

    def __init__(self, run_dir: Path | None, checkpoint_round: int | None) -> None:
        super().__init__(str(run_dir))
        self.run_dir = run_dir
        self.checkpoint_round = checkpoint_round


def interrupted_line(exc: BaseException, resume_command: str) -> str:
    """The one line a command prints after Ctrl-C. ``resume_command`` has ``{run_dir}`` where the
    run directory goes (``pflower sim resume={run_dir}``)."""
    if isinstance(exc, RunInterrupted) and exc.run_dir is not None and exc.checkpoint_round is not None:
        return (
            f"pflower: stopped by Ctrl-C; {exc.run_dir} keeps its checkpoint of round {exc.checkpoint_round}: "
            f"continue with `{resume_command.format(run_dir=exc.run_dir)}`"
        )
    if isinstance(exc, RunInterrupted) and exc.run_dir is not None:
        return f"pflower: stopped by Ctrl-C before the run's first checkpoint; {exc.run_dir} has nothing to resume"
    return "pflower: stopped by Ctrl-C before the run began; nothing was written"


def _exit_now(signum: int, frame: object) -> None:  # noqa: ARG001 - a signal handler's signature
    """The second Ctrl-C: end every child process of this one and exit, without unwinding."""
    for child in multiprocessing.active_children():
        try:
            child.kill()
        except (OSError, AttributeError):
            pass
    for pid in _BELOW_AT_CTRL_C:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os.write(2, b"\npflower: second Ctrl-C: exited at once\n")
    os._exit(EXIT_INTERRUPTED)


_BELOW_AT_CTRL_C: list[int] = []


def below_at_ctrl_c() -> list[int]:
    """The processes below this one when the first Ctrl-C came. Ray's ClientApp actors are among
    them: Flower's teardown ends their raylet, and the actors, orphaned, outlive it for seconds."""
    return list(_BELOW_AT_CTRL_C)


def _first(signum: int, frame: object) -> None:  # noqa: ARG001
    signal.signal(signal.SIGINT, _exit_now)
    STOP.set()
    _BELOW_AT_CTRL_C[:] = descendants(os.getpid())
    raise KeyboardInterrupt


@contextmanager
def ctrl_c_stops_the_run() -> Iterator[None]:
    """Within: the first SIGINT raises ``KeyboardInterrupt``, the next exits 130 at once. A process
    whose SIGINT was set to be ignored (a background job of a non-interactive shell) keeps ignoring
    it; off the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, _first)
    try:
        yield
    finally:
        STOP.clear()
        _BELOW_AT_CTRL_C.clear()
        if signal.getsignal(signal.SIGINT) is _first:  # after a first Ctrl-C the next one still exits at once
            signal.signal(signal.SIGINT, previous)


def ignore_ctrl_c() -> None:
    """For worker processes: the parent stops them; a Ctrl-C to the process group must not."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (children, theirs...), read from /proc."""
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        kids.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], list(kids.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(kids.get(child, []))
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, which only waits for its parent to read its status, does not)."""
    try:
        return not Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0].startswith("Z")
    except (OSError, IndexError):
        return False


def end_processes(pids: list[int], grace_s: float = 10.0) -> list[int]:
    """Wait up to ``grace_s`` for ``pids`` to exit by themselves, then SIGTERM, then SIGKILL what is
    left; returns the pids that had to be ended."""
    import time

    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    ended = [p for p in pids if alive(p)]
    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 1.0)):
        for pid in [p for p in ended if alive(p)]:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(alive(p) for p in ended):
            time.sleep(0.1)
    return ended
