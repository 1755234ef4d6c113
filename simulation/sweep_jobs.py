"""``pflower sim -m ... --jobs N``: a sweep's runs, N at a time, each its own ``pflower sim`` process.

Every run of a sweep is independent (its own config, seed, run directory, checkpoints and
provenance), so running several at once changes nothing in any of them: each is the command
``pflower sim <its overrides>`` that the sequential sweep would have run in its place. Their
output reaches this terminal line by line, prefixed with the run's place in the sweep. The
cores are split between the runs: each run may use ``cores // N`` of them (at least 1; the
``PFLOWER_CORES`` variable of its process), which its ``workers=auto`` takes (at most 4 when its
clients compute on CUDA); a run whose command line sets ``workers`` keeps that count.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path


def parse_jobs(argv: list[str]) -> tuple[int, list[str]]:
    """``--jobs N`` / ``-j N`` / ``--jobs=N`` taken out of ``argv``: (N, the rest); N is 1 when absent."""
    rest, jobs, i = [], 1, 0
    while i < len(argv):
        arg = argv[i]
        value = None
        if arg in ("--jobs", "-j"):
            if i + 1 >= len(argv):
                raise ValueError(f"{arg} needs a number of runs to run at once, e.g. {arg} 2")
            value, i = argv[i + 1], i + 2
        elif arg.startswith("--jobs="):
            value, i = arg.split("=", 1)[1], i + 1
        else:
            rest.append(arg)
            i += 1
            continue
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"--jobs must be a whole number >= 1, got {value!r}")
        jobs = int(value)
    return jobs, rest


def pflower_bin() -> str:
    here = Path(sys.executable).parent / "pflower"
    return str(here) if here.exists() else "pflower"


def _stop_runs(
    procs: dict[int, subprocess.Popen], readers: list[threading.Thread], pending: list[int], total: int
) -> int:
    """Ctrl-C: each running run gets one SIGINT (it keeps its checkpoint and prints how to continue;
    after 20 s it is killed), the runs not yet started are not; returns 130."""
    import signal

    from pflower.server_app.interrupt import EXIT_INTERRUPTED

    live = [p for p in procs.values() if p.poll() is None]
    for proc in live:
        proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 20
    for proc in live:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for reader in readers:
        reader.join(timeout=2)  # their last lines (each run's "continue with ...")
    print(
        f"pflower: stopped by Ctrl-C: {len(live)} running run(s) stopped, each above with its line on how to "
        f"continue; {len(pending)} of the sweep's {total} runs had not started",
        flush=True,
    )
    return EXIT_INTERRUPTED


def run_concurrently(combos: Sequence[Sequence[str]], jobs: int, cwd: Path | None = None) -> int:
    """Run each combination as ``pflower sim <overrides>``, ``jobs`` at a time; returns 0 when
    every run succeeded, else the first failing run's exit status (after all have ended)."""
    from pflower.server_app.config import CORES_ENV, default_workers

    total = len(combos)
    share = max(1, default_workers() // jobs)
    lock = threading.Lock()
    statuses: list[int | None] = [None] * total
    procs: dict[int, subprocess.Popen] = {}
    started = time.perf_counter()

    def one(k: int) -> None:
        overrides = list(combos[k])
        label = f"[run {k + 1}/{total}]"
        with lock:
            print(f"{label} pflower sim {' '.join(overrides)} ({CORES_ENV}={share})", flush=True)
        proc = subprocess.Popen(
            [pflower_bin(), "sim", *overrides],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env={**os.environ, CORES_ENV: str(share)},
            # its own process group: a Ctrl-C reaches it once, forwarded by this process
            # (two would make it exit at once, without its line on how to continue)
            start_new_session=True,
        )
        procs[k] = proc
        assert proc.stdout is not None
        for line in proc.stdout:
            with lock:
                sys.stdout.write(f"{label} {line}")
                sys.stdout.flush()
        statuses[k] = proc.wait()
        with lock:
            print(
                f"{label} ended with exit status {statuses[k]} ({time.perf_counter() - started:.0f} s into the sweep)",
                flush=True,
            )

    pending = list(range(total))
    running: list[threading.Thread] = []
    try:
        while pending or running:
            running = [t for t in running if t.is_alive()]
            while pending and len(running) < jobs:
                thread = threading.Thread(target=one, args=(pending.pop(0),), daemon=True)
                thread.start()
                running.append(thread)
            time.sleep(0.2)
    except KeyboardInterrupt:
        return _stop_runs(procs, running, pending, total)
    failed = [(k, s) for k, s in enumerate(statuses) if s]
    if failed:
        names = ", ".join(f"run {k + 1} ({' '.join(combos[k])}: exit {s})" for k, s in failed)
        print(f"pflower: {len(failed)} of {total} runs failed: {names}", file=sys.stderr)
        return failed[0][1] or 1
    print(
        f"pflower: the sweep's {total} runs ended, {jobs} at a time, in {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    return 0
