"""`pflower superlink status|stop` find the local SuperLink of this FLWR_HOME and Control API port
only, show its working directory, and stop it without touching another one (issue 16, item 4).
Stand-ins named ``flower-superlink`` with the local SuperLink's flags keep this fast; the real
one is stopped the same way in tests/integration/test_simulation.py::test_flwr_run_dot."""

import subprocess
import sys
import time

import pytest

from server_app import superlink
from server_app.cli import main

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def fake_superlink(tmp_path, name: str, control_port: int) -> subprocess.Popen:
    home = tmp_path / name
    (home / "local-superlink").mkdir(parents=True)
    script = tmp_path / name / "flower-superlink"
    script.write_text("import time\ntime.sleep(120)\n")
    cwd = tmp_path / f"{name}-cwd"
    cwd.mkdir()
    args = [sys.executable, str(script), "--insecure", "--simulation", "--control-api-address", f"127.0.0.1:{control_port}",
            "--port", str(control_port - 2), "--log-file", str(home / "local-superlink" / "superlink.log")]
    return subprocess.Popen(args, cwd=cwd)


def test_status_and_stop_touch_only_this_flwr_home_and_port(tmp_path, monkeypatch, capsys):
    ours, other = fake_superlink(tmp_path, "home-a", 45093), fake_superlink(tmp_path, "home-b", 45193)
    try:
        time.sleep(0.3)
        monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home-a"))
        monkeypatch.setenv("FLWR_LOCAL_CONTROL_API_PORT", "45093")
        assert main(["superlink", "status"]) == 0
        out = capsys.readouterr().out
        assert f"pid {ours.pid}: HTTP API 127.0.0.1:45091, Control API 127.0.0.1:45093" in out
        assert f"working directory {tmp_path / 'home-a-cwd'} " in out
        assert f"pid {other.pid}" in out.split("your other local SuperLinks", 1)[1]  # listed as another, not as ours
        assert main(["superlink", "stop"]) == 0
        assert capsys.readouterr().out.startswith(f"stopped the local SuperLink pid {ours.pid}")
        assert ours.wait(timeout=10) is not None and other.poll() is None  # the other one still runs
        assert main(["superlink", "stop"]) == 0 and "nothing to stop" in capsys.readouterr().out
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()


def test_mine_matches_home_and_port():
    a = superlink.LocalSuperLink(1, "39091", "39093", superlink.Path("/h/a"), None)
    b = superlink.LocalSuperLink(2, "39191", "39193", superlink.Path("/h/a"), None)
    c = superlink.LocalSuperLink(3, "39091", "39093", superlink.Path("/h/c"), None)
    assert superlink.mine([a, b, c], superlink.Path("/h/a"), "39093") == [a]


def test_usage_errors_exit_2(capsys):
    assert main(["superlink"]) == 2 and main(["superlink", "kill"]) == 2
    assert "status|stop" in capsys.readouterr().out


def test_sim_help_lists_keys_groups_and_examples(capsys):
    from server_app.config import config_keys

    assert main(["sim", "--help"]) == 0
    out = capsys.readouterr().out
    for key in [k for k in config_keys() if "." not in k]:
        assert f"\n  {key} " in out, key
    assert "kapc_bls" in out and "fmnist" in out and "paper_results" not in out
    assert "seed                   42         model init" in out and out.count("pflower sim ") >= 3
