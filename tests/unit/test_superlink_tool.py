"""`pflower superlink status|stop` find this folder's local SuperLinks only (the shell's FLWR_HOME
and Control API port when started here, and `pflower run`'s for this checkout), show their working
directories, and stop them without touching another checkout's or shell's (issues 16 and 58).
Stand-ins named ``flower-superlink`` with the local SuperLink's flags keep this fast; the real
one is stopped the same way in tests/integration/test_simulation.py::test_flwr_run_dot."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from pflower.cli import main
from pflower.server_app import superlink

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def fake_superlink(tmp_path, name: str, control_port: int, home=None, cwd=None) -> subprocess.Popen:
    home = home or tmp_path / name
    (home / "local-superlink").mkdir(parents=True, exist_ok=True)
    script = tmp_path / f"{name}-bin" / "flower-superlink"
    script.parent.mkdir()
    script.write_text("import time\ntime.sleep(120)\n")
    cwd = cwd or tmp_path / f"{name}-cwd"
    cwd.mkdir(exist_ok=True)
    args = [
        sys.executable,
        str(script),
        "--insecure",
        "--simulation",
        "--control-api-address",
        f"127.0.0.1:{control_port}",
        "--port",
        str(control_port - 2),
        "--log-file",
        str(home / "local-superlink" / "superlink.log"),
    ]
    return subprocess.Popen(args, cwd=cwd)


def test_status_and_stop_touch_only_this_flwr_home_and_port(tmp_path, monkeypatch, capsys):
    ours, other = fake_superlink(tmp_path, "home-a", 45093), fake_superlink(tmp_path, "home-b", 45193)
    try:
        time.sleep(0.3)
        monkeypatch.chdir(tmp_path / "home-a-cwd")  # the folder `flwr run .` started it from
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
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


def test_default_stop_spares_another_checkouts_superlink_under_this_flwr_home(tmp_path, monkeypatch, capsys):
    """The shell's FLWR_HOME SuperLink started from another checkout, and another shell's, keep
    running; this checkout's `pflower run` SuperLink stops; --pid and --all stop what they name."""
    here = tmp_path / "checkout"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "shell-home"))
    monkeypatch.setenv("FLWR_LOCAL_CONTROL_API_PORT", "46093")
    shell_other = fake_superlink(tmp_path, "shell", 46093, home=tmp_path / "shell-home", cwd=tmp_path / "elsewhere")
    run_here = fake_superlink(tmp_path, "run", 46193, home=superlink.checkout_home(here), cwd=here)
    other_home = fake_superlink(tmp_path, "other", 46293)
    procs = (shell_other, run_here, other_home)
    try:
        time.sleep(0.3)
        assert main(["superlink", "status"]) == 0
        out = capsys.readouterr().out
        mine_part, others_part = out.split("your other local SuperLinks", 1)
        assert f"pid {run_here.pid}" in mine_part and f"pid {shell_other.pid}" in others_part
        assert f"pid {other_home.pid}" in others_part
        assert main(["superlink", "stop"]) == 0
        out = capsys.readouterr().out
        assert f"stopped the local SuperLink pid {run_here.pid}" in out
        assert f"left running: the SuperLink of this shell's FLWR_HOME, started from {tmp_path / 'elsewhere'}" in out
        assert f"stop --pid {shell_other.pid}" in out
        assert run_here.wait(timeout=10) is not None
        assert shell_other.poll() is None and other_home.poll() is None  # another checkout's and shell's run on
        assert main(["superlink", "stop", "--pid", "1"]) == 2  # not one of ours
        assert main(["superlink", "stop", "--pid", str(shell_other.pid)]) == 0
        assert shell_other.wait(timeout=10) is not None and other_home.poll() is None
        found = superlink.local_superlinks  # --all here must not reach a real SuperLink another test runs
        monkeypatch.setattr(superlink, "local_superlinks", lambda: [s for s in found() if s.pid == other_home.pid])
        assert main(["superlink", "stop", "--all"]) == 0
        assert other_home.wait(timeout=10) is not None
    finally:
        for proc in procs:
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
    from pflower.server_app.config import config_keys

    assert main(["sim", "--help"]) == 0
    out = capsys.readouterr().out
    for key in [k for k in config_keys() if "." not in k]:
        assert f"\n  {key} " in out, key
    assert "kapc_bls" in out and "fmnist" in out and "paper_results" not in out
    assert "seed                   42         model init" in out and out.count("pflower sim ") >= 3


# ----------------------------------------------------------------------------- one checkout, one SuperLink

ROOT = superlink.Path(__file__).resolve().parents[2]


def code_tree(dest, change: str | None = None):
    """A pflower tree with this checkout's code (what the FAB of `flwr run .` holds), one file changed
    where ``change`` names it."""
    import shutil

    from pflower.server_app.provenance import CODE_DIRS

    for folder in CODE_DIRS:
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", dest / "pyproject.toml")
    if change:
        with (dest / change).open("a") as f:
            f.write("# another branch\n")
    return dest


def test_a_run_from_another_checkout_is_refused_with_the_fix(tmp_path):
    """The ServerApp's check (issue 43, item 2): the app's code against the checkout the local
    SuperLink was started in; the same code, or a SuperLink started outside any checkout, passes."""
    from pflower.server_app.config import ConfigError

    app = code_tree(tmp_path / "fab")
    superlink.check_superlink_checkout(app, code_tree(tmp_path / "same"))
    superlink.check_superlink_checkout(app, tmp_path)  # not a pflower tree: nothing to compare
    other = code_tree(tmp_path / "other", change="strategies/fedper.py")
    assert superlink.differing_code(app, other) == ["strategies/fedper.py"]
    with pytest.raises(ConfigError) as err:
        superlink.check_superlink_checkout(app, other)
    text = str(err.value)
    assert str(other) in text and "strategies/fedper.py" in text
    assert "pflower superlink stop" in text and "pflower run" in text


def fake_flwr(tmp_path, status: str, started: bool = True):
    """A stand-in `flwr` on PATH: `run` prints Flower's start line, `ls` the run's status as JSON."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "flwr"
    run_line = "echo 'Successfully started run 4242'" if started else "echo 'no SuperLink'; exit 1"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = run ]; then echo "FLWR_HOME=$FLWR_HOME ARGS=$*"; {run_line}; exit 0; fi\n'
        f"""if [ "$1" = ls ]; then echo '{{"runs": [{{"run-id": "4242", "status": "{status}"}}]}}'; fi\n"""
    )
    script.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("status, code", [("finished:completed", 0), ("finished:failed", 1), ("finished:stopped", 1)])
def test_pflower_run_exits_with_the_run_s_status(tmp_path, monkeypatch, capsys, status, code):
    """`flwr run --stream` exits 0 for a failed run; `pflower run` asks `flwr ls` and exits with the run's
    status, through a SuperLink home of this checkout's own."""
    monkeypatch.delenv("FLWR_HOME", raising=False)  # this checkout's own home
    monkeypatch.setattr(superlink, "FLWR", ["flwr"])  # the fake on PATH, not Flower's CLI
    monkeypatch.setenv("PATH", f"{fake_flwr(tmp_path, status)}:{superlink.os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    checkout = code_tree(tmp_path / "checkout")
    assert superlink.run_main(["--run-config", "rounds=1"], checkout=checkout) == code
    out = capsys.readouterr()
    home = superlink.checkout_home(checkout)
    assert f"FLWR_HOME={home}" in out.out and home.is_relative_to(tmp_path / "cache" / "pflower" / "superlinks")
    assert f"run 4242 {status}" in (out.out if code == 0 else out.err)
    ports = superlink.json.loads((home / "ports.json").read_text())
    assert ports["checkout"] == str(checkout.resolve()) and ports["http"] != ports["control"]
    assert superlink.checkout_home(code_tree(tmp_path / "second")) != home  # a second checkout, a second SuperLink


def test_pflower_run_uses_the_users_flwr_home_and_says_why_its_supernodes_differ(tmp_path, monkeypatch, capsys):
    """Issue 76 (5): a FLWR_HOME the user set is used, with its config.toml's federation where it fits
    the run; a num-supernodes that differs from num_clients is replaced, with one line saying why."""
    monkeypatch.setattr(superlink, "FLWR", ["flwr"])  # the fake on PATH, not Flower's CLI
    monkeypatch.setenv("PATH", f"{fake_flwr(tmp_path, 'finished:completed')}:{superlink.os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    home = tmp_path / "my-flwr"
    home.mkdir()
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n\n'
        "[superlink.local.options]\nnum-supernodes = 3\n\n"
        "[superlink.local.options.backend.client-resources]\nnum-cpus = 2\n"
    )
    monkeypatch.setenv("FLWR_HOME", str(home))
    assert superlink.run_main(["--run-config", "num_clients=3 method='fedavg'"], checkout=ROOT) == 0
    out = capsys.readouterr()
    ran = next(line for line in out.out.splitlines() if line.startswith("FLWR_HOME="))
    assert ran.startswith(f"FLWR_HOME={home} ") and "--federation-config" not in ran  # the user's 3 SuperNodes, 2 CPUs
    assert f"your FLWR_HOME={home}" in out.err and not (tmp_path / "cache" / "pflower").exists()
    assert superlink.run_main(["--run-config", "num_clients=5 method='fedavg'"], checkout=ROOT) == 0
    out = capsys.readouterr()
    ran = next(line for line in out.out.splitlines() if line.startswith("FLWR_HOME="))
    assert ran.endswith("--federation-config num-supernodes=5 --stream"), ran  # num-cpus stays the user's
    said = [line for line in out.err.splitlines() if "SuperNodes" in line]
    assert len(said) == 1 and "5 SuperNodes (the run's num_clients), not the 3 of" in said[0]
    assert str(home / "config.toml") in said[0] and "set num_clients=3" in said[0]


def test_pflower_run_keeps_off_a_users_superlink_started_from_another_checkout(tmp_path, monkeypatch):
    """The user's FLWR_HOME, except where its running local SuperLink was started from another
    checkout (it would run this checkout's code with that one's environment): then this checkout's
    own, and one line says why."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    home = tmp_path / "my-flwr"
    monkeypatch.setenv("FLWR_HOME", str(home))
    monkeypatch.setenv("FLWR_LOCAL_CONTROL_API_PORT", "46093")
    here = code_tree(tmp_path / "here")
    other = fake_superlink(tmp_path, "other", 46093, home=home, cwd=tmp_path / "elsewhere")
    try:
        wait_until_listed(other.pid)
        env, said = superlink.run_env(here.resolve())
        assert env["FLWR_HOME"] == str(superlink.checkout_home(here)) and "started from another checkout" in said
        assert str(tmp_path / "elsewhere") in said
        env, said = superlink.run_env((tmp_path / "elsewhere").resolve())  # the checkout it was started from
        assert Path(env["FLWR_HOME"]).resolve() == home.resolve() and said.startswith("pflower run: your FLWR_HOME=")
    finally:
        other.kill()
        other.wait()


def wait_until_listed(pid: int) -> None:
    import time

    for _ in range(50):
        if any(s.pid == pid for s in superlink.local_superlinks()):
            return
        time.sleep(0.1)
    raise AssertionError(f"fake SuperLink {pid} not listed")


def test_pflower_run_refuses_unquoted_run_config_and_missing_data_in_seconds(capsys):
    """Issue 76 (5): Flower's ClickException for `lr=abc`, a missing data folder and more clients than
    the data holds are one line and exit 2 before anything starts (the README's promise)."""
    for run_config, said in (
        ("lr=abc", "--run-config 'lr=abc' is not Flower's run-config syntax"),
        ("num_clients=500", "500 clients x min_size"),
        ("dataset='fmnist' overrides='dataset.root=/no/such/folder'", "does not hold its files"),
    ):
        assert superlink.run_main(["--run-config", run_config], checkout=ROOT) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("pflower: ") and said in err[0], err


def test_pflower_run_without_a_started_run_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("FLWR_HOME", raising=False)  # this checkout's own home
    monkeypatch.setattr(superlink, "FLWR", ["flwr"])  # the fake on PATH, not Flower's CLI
    monkeypatch.setenv("PATH", f"{fake_flwr(tmp_path, 'x', started=False)}:{superlink.os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert superlink.run_main([], checkout=code_tree(tmp_path / "checkout")) == 1
    assert "started no run" in capsys.readouterr().err


def test_pflower_run_refuses_a_bad_setting_before_anything_starts_and_sizes_the_federation():
    """Issue 58: `pflower run --run-config "alpha=-1"` is one line and exit 2 in seconds (no SuperLink,
    no run); without --federation-config the simulated SuperNodes are the run's num_clients."""
    with pytest.raises(ValueError, match="alpha must be > 0"):
        superlink.checked_flwr_args(["--run-config", "alpha=-1"], ROOT)
    assert superlink.checked_flwr_args([], ROOT) == (
        ["--federation-config", "num-supernodes=20 client-resources-num-cpus=1"],
        [],
    )
    assert superlink.checked_flwr_args(["-c", "num_clients=4 method='fedavg'"], ROOT)[0][-1].startswith(
        "num-supernodes=4 "
    )
    given = ["--run-config=num_clients=4", "--federation-config", "num-supernodes=4"]
    assert superlink.checked_flwr_args(list(given), ROOT) == (given, [])  # the user's own federation is kept


def test_pflower_run_exits_2_on_a_bad_setting(tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(superlink.subprocess, "Popen", lambda *a, **k: started.append(a))
    assert superlink.run_main(["--run-config", "method='nosuch'"], checkout=ROOT) == 2
    assert "pflower: unknown method 'nosuch'" in capsys.readouterr().err and not started


def test_pflower_run_keeps_a_half_migrated_superlink_state_aside(tmp_path, monkeypatch, capsys):
    """Issue 60: a `flower-superlink` killed while it migrated its state leaves `_alembic_tmp_run`
    behind, and every later start failed ("exited with code 1"). `pflower run` keeps that state
    aside, says so in one line, and starts on a fresh one; a healthy state is left as it is."""
    monkeypatch.delenv("FLWR_HOME", raising=False)  # this checkout's own home
    import sqlite3

    monkeypatch.setattr(superlink, "FLWR", ["flwr"])  # the fake on PATH, not Flower's CLI
    monkeypatch.setenv("PATH", f"{fake_flwr(tmp_path, 'finished:completed')}:{superlink.os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    checkout = code_tree(tmp_path / "checkout")
    state = superlink.checkout_home(checkout) / "local-superlink" / "state.db"
    state.parent.mkdir(parents=True)
    with sqlite3.connect(state) as db:
        db.execute("CREATE TABLE run (id INTEGER)")
    assert superlink.unusable_state(state) is None and superlink.recover_state(state.parent.parent) is None
    with sqlite3.connect(state) as db:
        db.execute("CREATE TABLE _alembic_tmp_run (id INTEGER)")
    (state.parent / "state.db-wal").write_bytes(b"")
    assert superlink.run_main([], checkout=checkout) == 0
    err = capsys.readouterr().err.strip().splitlines()
    kept = sorted(state.parent.glob("state.db.unusable-*"))
    assert [p.name.rsplit("-", 1)[-1] for p in kept][-1] == "wal" and not state.exists()
    assert len(err) == 1 and "left _alembic_tmp_run behind" in err[0] and "kept aside as" in err[0]
    state.write_bytes(b"not a database at all")
    assert "not a readable SQLite database" in superlink.unusable_state(state)


def test_pflower_run_finds_flowers_commands_in_its_environment_when_it_is_not_activated(tmp_path, monkeypatch):
    """`.venv/bin/pflower run` without `activate`: Flower starts `flower-superlink` by name, so the
    environment's bin joins PATH (after what the user's PATH holds)."""
    bin_dir = str(Path(superlink.sys.executable).parent)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    env = superlink.checkout_env(tmp_path, {"PATH": "/usr/bin"})
    assert env["PATH"].split(superlink.os.pathsep) == ["/usr/bin", bin_dir]
    assert superlink.checkout_env(tmp_path, {"PATH": bin_dir})["PATH"] == bin_dir  # not twice
