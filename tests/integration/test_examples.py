"""The example apps under examples/ run as a user runs them: `flwr run <app>` in local simulation,
pflower installed (here: this checkout), each app with its own model and data."""

from __future__ import annotations

import os
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


def flwr_run(app: str, env: dict[str, str], supernodes: int) -> str:
    cmd = ["flwr", "run", ".", "--stream", "--federation-config", f"num-supernodes={supernodes}"]
    proc = subprocess.run(cmd, cwd=ROOT / "examples" / app, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in log, log[-4000:]
    return log


def test_quickstart_pytorch_switched_to_fedcmd_trains_its_own_net(flwr_env):
    log = flwr_run("quickstart-fedcmd", flwr_env, 4)
    assert "layer groups: conv1, conv2, fc1, fc2, fc3" in log and "[round   4/4]" in log, log[-3000:]
    assert "phase 2 | personal_layer fc" in log  # the vote chose a layer and FedCMD's phase 2 ran
    assert 'quickstart-fedcmd: {"personal_layer": "fc' in log


def test_a_clientapp_of_its_own_runs_under_fedper(flwr_env):
    log = flwr_run("own-clientapp-fedper", flwr_env, 3)
    assert "[round   3/3]" in log and "final evaluation over 3 clients" in log, log[-3000:]
    assert "dropped" not in log  # every reply met the message contract
