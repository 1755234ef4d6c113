"""pflower/compat.py holds every use of another library's internals; each is checked here for the
members and parameters pflower relies on, so a release that changes one fails by name (issue 44).
A second test keeps the rest of the code from reaching into internals behind compat's back."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
from pathlib import Path

from pflower import compat

ROOT = Path(__file__).resolve().parents[2]
CODE = ("server_app", "client_app", "strategies", "models", "protocol", "federated_data", "benchmarks", "scripts")


def params(func) -> set[str]:
    return set(inspect.signature(func).parameters)


def test_flowers_logger_error_codes_and_task_identity():
    assert isinstance(compat.FLOWER_LOGGER, logging.Logger)
    assert "colored" in params(compat.update_console_handler)
    for code in ("LOAD_CLIENT_APP_EXCEPTION", "CLIENT_APP_RAISED_EXCEPTION", "CLIENT_APP_CRASHED", "NODE_UNAVAILABLE"):
        assert isinstance(getattr(compat.ErrorCode, code), int), code
    for attr in ("run_id", "node_id", "task_id"):  # settable class properties (the in-process grid sets them)
        assert isinstance(getattr(type(compat.TaskIdentity), attr, None), property), attr
        assert getattr(type(compat.TaskIdentity), attr).fset is not None, attr
    assert isinstance(compat.node_unavailable_reason(), str) and compat.node_unavailable_reason()


def test_the_supernode_loop_pflower_supernode_patches():
    """The idle wait pflower-supernode replaces: `time.sleep(3)` after an empty pull in Flower's
    SuperNode loop, reached through the module's own `time` name."""
    import time

    loop = compat.supernode_loop()
    assert loop.module.time is time and callable(loop.pull) and callable(loop.flower_supernode)
    assert callable(loop.push)
    source = inspect.getsource(loop.module.start_client_internal)
    assert "run_id = _pull_and_store_message(" in source and "if run_id is None:" in source
    assert "_push_messages(" in source.split("if run_id is None:", 1)[1]  # after a message: wait, send
    assert "time.sleep(3)" in source.split("if run_id is None:", 1)[1].split("continue", 1)[0]


def test_flowers_run_config_parser():
    assert compat.parse_run_config(["alpha=0.5 method='fedper'", "rounds=3"]) == {
        "alpha": 0.5,
        "method": "fedper",
        "rounds": 3,
    }


def test_the_clientapp_runtime_the_fork_server_calls():
    rt = compat.clientapp_runtime()
    assert {
        "runtime_api_address",
        "token",
        "insecure",
        "certificates",
        "parent_pid",
        "runtime_dependency_install",
    } <= params(rt.run_clientapp)
    assert len(params(rt.validate_and_resolve_root_certificates)) >= 2


def test_the_superexec_parts_warm_clientapps_plug_into():
    se = compat.superexec()
    for method in ("get_eligible_capacity", "wait_for_capacity", "launch", "close"):
        assert callable(getattr(se.SubprocessExecutor, method)), method
    fields = {f.name for f in dataclasses.fields(se.ExecutionSpec)}  # what ForkserverExecutor.launch reads
    assert {
        "task_type",
        "token",
        "runtime_api_address",
        "insecure",
        "root_certificates_path",
        "parent_pid",
        "runtime_dependency_install",
        "suppress_output",
        "task_id",
    } <= fields
    assert hasattr(se.TaskType, "CLIENT_APP") and hasattr(se.ExecutorType, "SUBPROCESS")
    assert callable(se.LaunchResult.accepted) and callable(se.LaunchResult.failed)
    assert callable(se.loop.get_executor) and {"executor_type"} <= params(se.loop.get_executor)
    assert callable(se.flower_superexec)


def test_flowers_fab_build_calls_the_walk_server_app_flwr_cli_replaces():
    """flwr_cli swaps ``flwr.cli.build.collect_files``: the FAB build must still look it up there."""
    import inspect

    cli = compat.flwr_cli()
    assert callable(cli.app) and params(cli.collect_files) == {"root"}
    assert "collect_files(" in inspect.getsource(cli.build.build_fab_from_disk)


def test_rays_bootstrap_address():
    assert len(params(compat.ray_bootstrap_address)) == 1


# Flower's public API: flwr.app, flwr.serverapp, flwr.clientapp, flwr.simulation, and flwr.common's own names
INTERNAL = re.compile(
    r"^\s*(from|import)\s+(flwr\.(supercore|supernode|server|common\.\w+|app\.\w+)|hydra\._internal|ray\._private)\b"
)


def test_no_module_but_compat_imports_another_librarys_internals():
    found = []
    for folder in CODE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "protocol" / "compat.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if INTERNAL.match(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "import these through pflower/compat.py:\n" + "\n".join(found)
