"""pflower-superexec (client_app/forkserver.py): ClientApps forked from a warm process.

The whole path (a SuperNode in process isolation, this SuperExec, four methods) runs in
tests/e2e/test_deployment_methods.py; here: the parts, without Flower's
processes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pflower.client_app import forkserver

ROOT = Path(__file__).resolve().parents[2]


def test_preload_flag_is_taken_out_and_every_other_flag_is_flowers():
    assert forkserver.split_preload(["--preload", "torch,colorsys", "--insecure"]) == (
        ("torch", "colorsys"),
        ["--insecure"],
    )
    assert forkserver.split_preload(["--runtime-api-address", "a:1", "--preload=numpy"]) == (
        ("numpy",),
        ["--runtime-api-address", "a:1"],
    )
    assert forkserver.split_preload(["--insecure"]) == (forkserver.DEFAULT_PRELOAD, ["--insecure"])
    with pytest.raises(SystemExit, match="comma-separated list"):
        forkserver.split_preload(["--insecure", "--preload"])


def _probe(preload: tuple[str, ...], expect: tuple[str, ...]) -> int:
    """Exit code of a child forked from a fresh fork server that preloaded ``preload``, checking
    that ``expect`` are imported (multiprocessing keeps one fork server per process: a new one
    needs a new process)."""
    script = textwrap.dedent(f"""
        from pflower.client_app import forkserver
        ex = forkserver.ForkserverExecutor({preload!r})
        probe = ex._ctx.Process(target=forkserver._preloaded, args=({expect!r},))
        probe.start(); probe.join(60)
        raise SystemExit(probe.exitcode)
    """)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=120).returncode


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_the_fork_server_imports_its_modules_once():
    assert _probe(("colorsys",), ("colorsys",)) == 0  # a module nothing else here imports
    assert _probe((), ("colorsys",)) == 3  # the check can fail: without preloading, the child lacks it


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_warm_up_refuses_a_module_the_fork_server_cannot_import():
    script = textwrap.dedent("""
        from pflower.client_app import forkserver
        try:
            forkserver.ForkserverExecutor(("colorsys", "no_such_module_xyz")).warm_up(60)
        except RuntimeError as err:
            print(err)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "could not import ['colorsys', 'no_such_module_xyz']" in out.stdout and "--preload" in out.stdout


def test_the_packages_a_child_forgets_are_the_projects_packages():
    import tomllib

    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert forkserver.APP_PACKAGES == {p.partition(".")[0] for p in packages} == {"pflower"}


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_a_forked_clientapp_loads_the_app_from_the_runs_fab_not_the_installed_copy(tmp_path):
    """After forget_app_modules, Flower's loader imports pflower.client_app.app from the FAB
    directory, as a fresh flwr-clientapp process does (the fork server's copy is the node's
    installed one). The FAB is laid out as the repository: pflower/__init__.py beside the parts."""
    import pflower

    fab = tmp_path / "fab"
    (fab / "pflower").mkdir(parents=True)
    (fab / "pflower" / "__init__.py").write_text((ROOT / "pflower" / "__init__.py").read_text())
    (fab / "pyproject.toml").write_text('[project]\nname = "pflower"\n')
    for part in pflower.PARTS:
        (fab / part).mkdir()
        (fab / part / "__init__.py").write_text("")
    (fab / "client_app" / "app.py").write_text("app = 'the FAB copy'\n")
    script = textwrap.dedent(f"""
        import sys
        import pflower.client_app.node, pflower.models  # what a fork of the SuperExec may have inherited
        from pflower.client_app.forkserver import forget_app_modules, APP_PACKAGES
        from flwr.supercore.object_ref import load_app
        gone = forget_app_modules()
        assert "pflower.client_app.node" in gone and "pflower.models" in gone, gone
        assert not [m for m in sys.modules if m.partition(".")[0] in APP_PACKAGES]
        print(load_app("pflower.client_app.app:app", ValueError, {str(fab)!r}))
        import pflower
        print(pflower.SOURCE_ROOT)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-2:] == ["the FAB copy", str(fab.resolve())]


def test_flowers_loop_gets_this_executor_for_subprocess_tasks_only(monkeypatch):
    from flwr.supercore.constant import ExecutorType
    from flwr.supercore.superexec import run_superexec as loop

    calls = []
    monkeypatch.setattr(loop, "get_executor", lambda kind, config=None, **kw: calls.append(kind) or "flower's")
    executor = forkserver.ForkserverExecutor(("colorsys",))
    forkserver.install(executor)
    assert loop.get_executor(ExecutorType.SUBPROCESS, None, insecure=True) is executor
    assert loop.get_executor(ExecutorType.KUBERNETES, {"x": 1}) == "flower's" and calls == [ExecutorType.KUBERNETES]


def test_other_task_types_start_as_flower_starts_them(monkeypatch):
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor.types import ExecutionSpec, LaunchResult

    executor = forkserver.ForkserverExecutor(("colorsys",))
    started = []
    monkeypatch.setattr(
        executor._fallback, "launch", lambda spec: started.append(spec.task_type) or LaunchResult.accepted()
    )
    spec = ExecutionSpec(
        task_type=TaskType.SERVER_APP,
        runtime_api_address="127.0.0.1:1",
        token="ab" * 16,
        insecure=True,
        root_certificates_path=None,
        runtime_dependency_install=False,
        parent_pid=None,
        suppress_output=True,
        task_id=1,
    )
    assert executor.launch(spec).status == "accepted" and started == [TaskType.SERVER_APP]
    assert executor.running == 0  # nothing was forked


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_the_command_exits_with_the_fix_when_a_preload_module_is_missing():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pflower.client_app.forkserver",
            "--preload",
            "no_such_module_xyz",
            "--runtime-api-address",
            "127.0.0.1:9",
            "--insecure",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "could not import ['no_such_module_xyz']" in out.stderr and "--preload" in out.stderr


# ----------------------------------------------------------------------------- several SuperNodes


def test_addresses_are_taken_repeated_or_comma_separated_and_every_other_flag_is_flowers():
    assert forkserver.split_addresses(["--runtime-api-address", "a:1,b:2", "--insecure"]) == (
        ["a:1", "b:2"],
        ["--insecure"],
    )
    assert forkserver.split_addresses(["--runtime-api-address=a:1", "--appio-api-address", "b:2", "-x"]) == (
        ["a:1", "b:2"],
        ["-x"],
    )
    assert forkserver.split_addresses(["--insecure"]) == ([], ["--insecure"])  # Flower's parser says it is required
    with pytest.raises(SystemExit, match="needs an address"):
        forkserver.split_addresses(["--runtime-api-address"])
    with pytest.raises(SystemExit, match="a:1 given twice"):
        forkserver.split_addresses(["--runtime-api-address", "a:1,b:2", "--runtime-api-address", "a:1"])


def test_each_supernode_served_installs_fabs_in_a_home_of_its_own(tmp_path):
    homes = forkserver.node_homes(["127.0.0.1:9094", "[::1]:9095"], tmp_path)
    assert homes == {
        "127.0.0.1:9094": str(tmp_path / "superexec-127.0.0.1-9094"),
        "[::1]:9095": str(tmp_path / "superexec-1-9095"),
    }


def test_the_first_address_runs_in_the_main_thread_with_the_health_server_the_others_in_threads():
    import threading

    calls, stopped = [], []
    done = threading.Event()

    def run_one(**kwargs):
        calls.append((kwargs["runtime_api_address"], kwargs["health_server_address"], threading.current_thread()))
        if kwargs["runtime_api_address"] == "c:3":
            done.set()

    run_all = forkserver.fan_out(["a:1", "b:2", "c:3"], run_one, lambda: stopped.append(True))
    run_all(runtime_api_address="a:1", health_server_address="h:9", insecure=True)
    assert done.wait(10)
    main = [c for c in calls if c[2] is threading.main_thread()]
    assert [(a, h) for a, h, _ in main] == [("a:1", "h:9")]
    assert sorted((a, h) for a, h, t in calls if t is not threading.main_thread()) == [("b:2", None), ("c:3", None)]


def test_a_loop_that_ends_in_a_thread_is_logged_and_stops_every_loop(caplog):
    import threading

    stopped = threading.Event()

    def run_one(**kwargs):
        if kwargs["runtime_api_address"] == "b:2":
            raise SystemExit(1)  # Flower's flwr_exit, say the SuperNode's Runtime API went away

    run_all = forkserver.fan_out(["a:1", "b:2"], run_one, stopped.set)
    with caplog.at_level("ERROR", logger="pflower.superexec"):
        run_all(runtime_api_address="a:1", health_server_address=None)
        assert stopped.wait(10)
    assert "the task loop for SuperNode b:2 ended with SystemExit: 1; stopping every loop" in caplog.text


def test_signal_handlers_are_registered_once_and_every_loops_exit_handlers_join_them():
    import threading

    registered, added = [], []
    register = forkserver.thread_aware(lambda *a, **kw: registered.append(kw["exit_handlers"]), added.append)
    register(event_type="leave", exit_handlers=["close a"])
    thread = threading.Thread(target=register, kwargs={"event_type": "leave", "exit_handlers": ["close b"]})
    thread.start()
    thread.join()
    assert registered == [["close a"]] and added == ["close b"]


def test_one_command_serves_several_supernodes_through_flowers_own_command(monkeypatch):
    """serve_several wires fan_out into Flower's flower-superexec (its parsed settings reach every
    loop) and its signal registration; the executor learns each node's FLWR_HOME."""
    import importlib
    import threading

    from flwr.supercore.superexec import run_superexec as loop

    cli = importlib.import_module("flwr.supercore.cli.flower_superexec")
    seen, done = [], threading.Event()

    def fake_run(**kwargs):
        seen.append((kwargs["runtime_api_address"], kwargs["insecure"]))
        if len(seen) == 2:
            done.set()
        if threading.current_thread() is not threading.main_thread():
            threading.Event().wait()  # a loop serves until the process ends (one that returns stops them all)

    monkeypatch.setattr(cli, "run_superexec", fake_run)
    monkeypatch.setattr(loop, "register_signal_handlers", loop.register_signal_handlers)
    monkeypatch.setenv("FLWR_HOME", "/tmp/flwr-home")
    executor = forkserver.ForkserverExecutor(("colorsys",))
    forkserver.serve_several(["a:1", "b:2"], executor)
    cli.run_superexec(runtime_api_address="a:1", insecure=True, health_server_address=None)
    assert done.wait(10) and sorted(seen) == [("a:1", True), ("b:2", True)]
    assert executor.homes == {"a:1": "/tmp/flwr-home/superexec-a-1", "b:2": "/tmp/flwr-home/superexec-b-2"}
