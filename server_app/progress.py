"""Progress of a run, and of a sweep of runs: one plain log line per round.

After each round's line the runner logs (``progress: true``, the default)::

    progress: round 17/30 [###########.........]  57% | elapsed 0:41 | ETA 0:24

and in a ``pflower sim -m`` sweep, where the run's position is known::

    progress: run 2/3 (method=fedper) | round 17/30 [###########.........]  57% | run 0:41, ETA 0:24 | sweep 3:10, ETA
    2:05

A line through Flower's logger rather than a redrawn bar: Flower logs every round to the
same stream, and a CI log keeps one readable line per round. Estimates assume the rate so
far holds: a run's ETA is its time per finished round (start-up left out) times the rounds left; a
sweep's adds, for each run still to start, the mean duration of the finished runs and the
current run's projected total (so they lean on the runs seen so far: a sweep over methods
of very different cost is estimated from the costs met up to now).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

Clock = Callable[[], float]


def format_duration(seconds: float | None) -> str:
    """``m:ss`` under an hour, ``h:mm:ss`` above; ``?`` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def eta(elapsed: float, done: int, total: int) -> float | None:
    """Seconds left once ``done`` of ``total`` units took ``elapsed`` seconds (constant rate).

    None before the first unit (no rate yet); 0 when nothing is left.
    """
    if done >= total:
        return 0.0
    if done <= 0:
        return None
    return elapsed / done * (total - done)


def sweep_eta(
    run_left: float | None, run_total: float | None, finished: Sequence[float], runs_after: int
) -> float | None:
    """Seconds left in a sweep: the current run's ``run_left`` plus ``runs_after`` more runs,
    each estimated as the mean of the ``finished`` runs' durations and ``run_total`` (the
    current run's projected duration). None while the current run has no estimate."""
    if run_left is None or run_total is None:
        return None
    if runs_after <= 0:
        return run_left
    per_run = (sum(finished) + run_total) / (len(finished) + 1)
    return run_left + runs_after * per_run


def bar(fraction: float, width: int = 20) -> str:
    """``[#####...............]``: ASCII, so it reads the same in any terminal or CI log."""
    fraction = min(max(fraction, 0.0), 1.0)
    filled = int(fraction * width + 1e-9)
    return "[" + "#" * filled + "." * (width - filled) + "]"


class Sweep:
    """Position and timing of the runs of one sweep (``pflower sim -m``), in this process.

    ``total`` is the number of runs when known (None otherwise), ``swept`` the keys that vary
    (they label each run); ``start_job`` and ``end_job`` bracket each run (``index`` is
    the run's 0-based place in the sweep).
    """

    def __init__(self, total: int | None = None, swept: Sequence[str] = (), clock: Clock = time.monotonic) -> None:
        self.total = total
        self.swept = list(swept)
        self.clock = clock
        self.started: float | None = None
        self.durations: list[float] = []
        self.index: int | None = None
        self.label = ""
        self.job_started: float | None = None

    def start_job(self, index: int, label: str = "") -> None:
        now = self.clock()
        if self.started is None:
            self.started = now
        if self.total is not None and index >= self.total:  # the size was misjudged: do not show a wrong N
            self.total = None
        self.index, self.label, self.job_started = index, label, now

    def end_job(self) -> None:
        if self.job_started is not None:
            self.durations.append(self.clock() - self.job_started)
        self.job_started = None

    def position(self) -> str:
        """``run 2/3 (method=fedper)``; ``run 2`` when the sweep's size is unknown."""
        k = "?" if self.index is None else str(self.index + 1)
        text = f"run {k}/{self.total}" if self.total is not None else f"run {k}"
        return f"{text} ({self.label})" if self.label else text


class RunProgress:
    """One run's progress line; ``first_round`` > 1 for a resumed run (its earlier rounds are
    not timed here). Created when the run starts: "elapsed" counts from then.

    The ETA's rate leaves out the start-up before the first round (client discovery, which in a
    simulation includes starting the workers): the first round counts as its own
    ``round_time`` when given, each later one as the wall time since the previous line.
    """

    def __init__(
        self, rounds: int, first_round: int = 1, sweep: Sweep | None = None, clock: Clock = time.monotonic
    ) -> None:
        self.rounds = int(rounds)
        self.first_round = int(first_round)
        self.sweep = sweep
        self.clock = clock
        self.started = clock()
        self.timed = 0.0  # seconds of the rounds seen so far
        self.last: float | None = None  # time of the previous line

    def line(self, rnd: int, round_time: float | None = None) -> str:
        """The line after round ``rnd``; ``round_time``: that round's own duration (seconds)."""
        now = self.clock()
        elapsed = now - self.started
        if self.last is not None:
            self.timed += now - self.last
        else:
            self.timed += min(round_time, elapsed) if round_time is not None else elapsed
        self.last = now
        left = eta(self.timed, rnd - self.first_round + 1, self.rounds - self.first_round + 1)
        head = f"round {rnd}/{self.rounds} {bar(rnd / max(self.rounds, 1))} {100 * rnd / max(self.rounds, 1):3.0f}%"
        if self.sweep is None:
            return f"progress: {head} | elapsed {format_duration(elapsed)} | ETA {format_duration(left)}"
        sweep = self.sweep
        job_elapsed = now - (sweep.job_started if sweep.job_started is not None else self.started)
        parts = [f"progress: {sweep.position()}", head, f"run {format_duration(elapsed)}, ETA {format_duration(left)}"]
        sweep_elapsed = format_duration(now - sweep.started) if sweep.started is not None else "?"
        if sweep.total is not None and sweep.index is not None:
            runs_after = sweep.total - sweep.index - 1
            total = None if left is None else job_elapsed + left
            parts.append(
                f"sweep {sweep_elapsed}, ETA {format_duration(sweep_eta(left, total, sweep.durations, runs_after))}"
            )
        else:
            parts.append(f"sweep {sweep_elapsed}")
        return " | ".join(parts)


def job_label(task_overrides: Sequence[str], swept: Sequence[str]) -> str:
    """The swept ``key=value`` pairs of one job's overrides (``method=fedper alpha=0.1``)."""
    keys = set(swept)
    return " ".join(o for o in task_overrides if o.split("=", 1)[0] in keys)
