"""Issue 76 (1): Ctrl-C stops a run, and everything it started, within seconds; the checkpoint stays
and the one line printed says how to continue; a second Ctrl-C exits at once.

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
@pytest.mark.parametrize("backend", ["parallel", "serial", "batched", "ray"])
def test_ctrl_c_stops_pflower_sim_keeps_the_checkpoint_and_the_run_resumes(tmp_path, backend):
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


@pytest.mark.slow
def test_ctrl_c_stops_pflower_run_on_the_superlink_and_every_process_of_the_run(tmp_path):
    """`pflower run`: the run is stopped on the SuperLink (`flwr stop`), its flwr-simulation and Ray
    processes end, the line names the resume command; the SuperLink stays up, as after any run."""
    from pflower.server_app.interrupt import alive, descendants
    from pflower.server_app.superlink import local_superlinks, stop

    env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # this test's own SuperLink home
    out = tmp_path / "out"
    run_config = " ".join(
        [
            "method='fedavg'",
            "rounds=1000",
            "num_clients=4",
            "local_epochs=1",
            "fraction=1.0",
            "progress=false",
            f"output_dir='{out}'",
            "overrides='partition.min_size=20 alpha=1.0'",
        ]
    )
    proc = start([str(BIN / "pflower"), "run", "--run-config", run_config], cwd=ROOT, env=env)
    try:
        wait_for(proc, r"\[round\s+3/1000\]", timeout=400)
        ours = [s for s in local_superlinks() if s.flwr_home and s.flwr_home.is_relative_to(tmp_path / "cache")]
        assert len(ours) == 1
        run_procs = [p for p in descendants(ours[0].pid) if b"superexec" not in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert run_procs  # flwr-simulation and Ray's processes
        code, seconds, rest = ctrl_c(proc)
        assert code == 130 and seconds < 10, (code, seconds, rest[-3000:])
        assert not [p for p in run_procs if alive(p)], rest[-2000:]
        line = rest.strip().splitlines()[-1]
        assert re.search(
            r"keeps its checkpoint of round \d+: continue with `pflower run --run-config \"resume='"
            + re.escape(str(out)),
            line,
        ), line
        assert "stopped on the SuperLink" in line and alive(ours[0].pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for s in local_superlinks():
            if s.flwr_home is not None and s.flwr_home.resolve().is_relative_to((tmp_path / "cache").resolve()):
                stop(s)
