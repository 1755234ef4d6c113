"""Issue 76 (1): Ctrl-C stops a run, and everything it started, within seconds; the checkpoint stays
and the one line printed says how to continue; a second Ctrl-C exits at once.

The engines that start Ray (Flower's simulation engine, `pflower run`) are in test_ctrl_c_ray.py,
one of the files whose tests never run beside another Ray (tests/conftest.py).

A terminal's Ctrl-C is SIGINT to the foreground process group: each command here runs in a
session of its own with SIGINT at its default (a background job of a non-interactive shell has it
ignored, which Python keeps), and the signal goes to the whole group, as a terminal sends it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SMALL = ["num_clients=4", "local_epochs=1", "partition.min_size=20", "alpha=1.0", "fraction=1.0", "progress=false"]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(cmd: list[str], cwd: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=_default_sigint,
    )


def wait_for(proc: subprocess.Popen, pattern: str, timeout: float) -> list[str]:
    """The lines ``proc`` printed up to the first that matches ``pattern``."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        lines.append(line)
        if re.search(pattern, line):
            return lines
        assert time.monotonic() < deadline, "".join(lines[-40:])
    raise AssertionError(f"ended before {pattern!r}:\n" + "".join(lines[-40:]))


def ctrl_c(proc: subprocess.Popen) -> tuple[int, float, str]:
    """SIGINT to the process group; (exit status, seconds to exit, the rest of its output)."""
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    return proc.returncode, time.monotonic() - t0, rest


def group_alive(pgid: int) -> list[str]:
    """The processes still in process group ``pgid`` (zombies aside)."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and not fields[0].startswith("Z"):
            left.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
    return left


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["parallel", "serial", "batched"])
def test_ctrl_c_stops_pflower_sim_keeps_the_checkpoint_and_the_run_resumes(tmp_path, backend):
    stops_and_resumes(tmp_path, backend)


def stops_and_resumes(tmp_path: Path, backend: str) -> None:
    """Ctrl-C at round 3 of a 1000-round `pflower sim`: exit 130 within 10 s, no traceback, no process
    of its group left, the line naming the run directory and its checkpoint; the resume runs on."""
    out = tmp_path / "out"
    proc = start(
        [
            str(BIN / "pflower"),
            "sim",
            "method=fedavg",
            "rounds=1000",
            *SMALL,
            f"backend={backend}",
            f"output_dir={out}",
        ],
        cwd=tmp_path,
    )
    wait_for(proc, r"\[round\s+3/1000\]", timeout=240)
    code, seconds, rest = ctrl_c(proc)
    assert code == 130 and seconds < 10, (code, seconds, rest[-3000:])
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest[-3000:]
    assert not group_alive(proc.pid)  # the parallel engine's workers, Ray's processes too
    line = rest.strip().splitlines()[-1]
    found = re.fullmatch(
        r"pflower: stopped by Ctrl-C; (\S+) keeps its checkpoint of round (\d+): continue with "
        r"`pflower sim resume=(\S+)`",
        line,
    )
    assert found and found.group(1) == found.group(3), line
    run_dir, done = Path(found.group(1)), int(found.group(2))
    assert done >= 2 and (run_dir / "checkpoint.npz").exists()  # round 3 was printed before its checkpoint
    resumed = subprocess.run(
        [str(BIN / "pflower"), "sim", f"resume={run_dir}", f"rounds={done + 1}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    rounds = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rounds) == done + 1


@pytest.mark.heavy  # over 1 s of one core: not in the quick tier
def test_a_second_ctrl_c_exits_at_once_while_the_first_winds_down(tmp_path):
    """The first Ctrl-C raises KeyboardInterrupt; while the program still winds down (here: it
    sleeps), the second exits 130 at once and ends its child processes."""
    script = tmp_path / "winds_down.py"
    script.write_text(
        textwrap.dedent(
            """
        import multiprocessing, time
        from pflower.server_app.interrupt import ctrl_c_stops_the_run

        if __name__ == "__main__":
            child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
            child.start()
            with ctrl_c_stops_the_run():
                try:
                    print("running", flush=True)
                    time.sleep(60)
                except KeyboardInterrupt:
                    print("winding down", flush=True)
                    time.sleep(60)
        """
        )
    )
    proc = start([sys.executable, str(script)], cwd=ROOT)
    wait_for(proc, "running", timeout=60)
    os.killpg(proc.pid, signal.SIGINT)
    wait_for(proc, "winding down", timeout=10)
    code, seconds, rest = ctrl_c(proc)
    assert code == 130 and seconds < 3 and "second Ctrl-C: exited at once" in rest, (code, seconds, rest)
    time.sleep(0.5)
    assert not group_alive(proc.pid)


@pytest.mark.slow
def test_ctrl_c_stops_a_sweep_of_runs_two_at_a_time_and_each_says_how_to_continue(tmp_path):
    out = tmp_path / "out"
    proc = start(
        [
            str(BIN / "pflower"),
            "sim",
            "-m",
            "seed=1,2,3",
            "--jobs",
            "2",
            "method=fedavg",
            "rounds=1000",
            *SMALL,
            "backend=serial",
            f"output_dir={out}",
        ],
        cwd=tmp_path,
    )
    wait_for(proc, r"\[round\s+3/1000\]", timeout=240)
    code, seconds, rest = ctrl_c(proc)
    assert code == 130 and seconds < 10, (code, seconds, rest[-3000:])
    assert rest.count("keeps its checkpoint of round") == 2 and "1 of the sweep's 3 runs had not started" in rest
    assert not group_alive(proc.pid)
