"""Issue 76 (1), the engines that start Ray: Ctrl-C under `pflower sim backend=ray` and `pflower run`
(test_ctrl_c.py has the others and the helpers). In tests/conftest.py's Ray unit: never two Rays at once."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
from test_ctrl_c import BIN, ROOT, ctrl_c, start, stops_and_resumes, wait_for


@pytest.mark.slow
def test_ctrl_c_stops_pflower_sim_under_ray_and_the_run_resumes(tmp_path):
    """The ServerApp runs in a thread of Flower's: it stops at its next poll, then Ray is shut down."""
    stops_and_resumes(tmp_path, "ray")


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
