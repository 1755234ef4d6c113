"""The example apps under examples/ run as a user runs them: `flwr run <app>` in local simulation,
pflower installed (here: this checkout), each app with its own model and data. (quickstart-fedcmd
runs under `flwr run` on the TLS deployment instead: tests/e2e/test_deployment_methods.py;
own-clientapp-fedper's ClientApp object on an in-process grid: tests/unit/test_client_mod.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_simulation import free_port, stop_local_superlink

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def flwr_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("flwr-home")
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    yield env
    stop_local_superlink(env)


def flwr_run(app: str | Path, env: dict[str, str], supernodes: int) -> str:
    cmd = ["flwr", "run", ".", "--stream", "--federation-config", f"num-supernodes={supernodes}"]
    proc = subprocess.run(cmd, cwd=ROOT / "examples" / app, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in log, log[-4000:]
    return log


@pytest.mark.parametrize("method", ["fedper", "fedcmd"])
def test_flowers_quickstart_switched_by_its_ten_line_diff_runs_under_flwr_run(flwr_env, tmp_path, method):
    """examples/quickstart-pytorch (a plain Flower app: FedAvg, its own train and evaluate)
    patched by switch/<method>.diff, the diff docs/api.md shows: at most 10 changed lines, the
    app's own train function kept, pflower's client_mod in front of it."""
    app = tmp_path / "quickstart-pytorch"
    shutil.copytree(ROOT / "examples" / "quickstart-pytorch", app)
    diff = (app / "switch" / f"{method}.diff").read_text()
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++ ", "--- "))]
    assert len(changed) <= 10, changed
    subprocess.run(["git", "apply", f"switch/{method}.diff"], cwd=app, check=True)
    log = flwr_run(app, flwr_env, 3)
    assert f"Starting {method} (3 rounds)" in log and "[round   3/3]" in log, log[-3000:]
    assert "final evaluation over 3 clients" in log and "quickstart-pytorch: saved 10 tensors" in log, log[-3000:]
    if method == "fedcmd":
        assert "phase 2 | personal_layer" in log, log[-3000:]


def test_a_clientapp_failure_under_the_simulation_engine_is_one_line_naming_its_traceback_file(flwr_env, tmp_path):
    """Issue 76 (2): the quickstart switched by the mod, but with FedProx (whose client the mod
    cannot run): under Ray, each client's failure was some 90 lines of Ray traceback (382 lines in
    all); now the first thing after the round starts is the pflower line naming the fix and the
    file that holds the traceback, and no traceback is printed."""
    app = tmp_path / "quickstart-pytorch"
    shutil.copytree(ROOT / "examples" / "quickstart-pytorch", app)
    subprocess.run(["git", "apply", "switch/fedper.diff"], cwd=app, check=True)
    server = app / "quickstart_pytorch" / "server_app.py"
    server.write_text(server.read_text().replace("FedPer", "FedProx"))
    cmd = ["flwr", "run", ".", "--stream", "--federation-config", "num-supernodes=3"]
    proc = subprocess.run(cmd, cwd=app, env=flwr_env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    after = log.split("Starting fedprox (3 rounds)", 1)[1]
    first = next(line for line in after.splitlines() if "WARNING" in line or "ERROR" in line)
    assert "dropped reply of client 0" in first and "trains in its own way" in first, log[-3000:]
    assert "build_clientapp" in first and "(traceback: " in first, first
    assert "Traceback (most recent call last)" not in log and len(after.splitlines()) < 40, log[-3000:]
    logged = Path(first.split("(traceback: ", 1)[1].split(")", 1)[0])
    assert "ModError: this method's client (role 'proximal')" in logged.read_text()
