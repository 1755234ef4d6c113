"""The one place pflower reaches into other libraries' internals: Flower's and Ray's.

Each name here is something pflower relies on that its library does not document as public API
(Flower's public API is ``flwr.app``, ``flwr.serverapp``, ``flwr.clientapp`` and
``flwr.simulation``). ``tests/unit/test_compat.py`` imports every one and checks the members and
parameters pflower uses, so a release that moves or changes one fails there, by name, rather than
deep inside a run. This is why ``pyproject.toml`` pins flwr to the release the suite passed on.

The cheap imports are done here; the ones that cost (Flower's SuperLink state, its SuperExec,
Ray) are functions that import on first use.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

# the error codes of Flower's error replies (strategies.base.replies; the in-process grid writes them)
from flwr.common.constant import ErrorCode

# Flower's logger and its console handler (pflower.logs, server_app.failures)
from flwr.supercore.logger import FLOWER_LOGGER, update_console_handler

# the identity a ServerApp process sets before its strategy builds Messages (the in-process grid)
from flwr.supercore.task_identity import TaskIdentity

__all__ = [
    "FLOWER_LOGGER",
    "ErrorCode",
    "TaskIdentity",
    "clientapp_runtime",
    "flwr_cli",
    "node_unavailable_reason",
    "parse_run_config",
    "supernode_loop",
    "ray_bootstrap_address",
    "superexec",
    "update_console_handler",
    "wire_measures",
]


def node_unavailable_reason() -> str:
    """The reason text of the SuperLink's error reply for a node that went away (its linkstate
    package costs about a second to import: only the in-process grid's lost-node path asks)."""
    from flwr.server.superlink.linkstate.utils import NODE_UNAVAILABLE_ERROR_REASON

    return str(NODE_UNAVAILABLE_ERROR_REASON)


def supernode_loop() -> SimpleNamespace:
    """The SuperNode's message loop (``flwr.supernode.start_client_internal``): the module whose
    ``time.sleep(3)`` is the idle wait between two pulls when no message came, its
    ``_pull_and_store_message`` (returns the run id of a pulled message, None when none came), its
    ``_push_messages`` (waits for the ClientApp's reply and sends it) and the ``flower-supernode``
    entry point. ``client_app.supernode`` replaces the module's ``time``
    and that function to poll fast after a message and at Flower's pace when idle."""
    import flwr.supernode.start_client_internal as loop_module
    from flwr.supernode.cli.flower_supernode import flower_supernode

    return SimpleNamespace(
        module=loop_module,
        pull=loop_module._pull_and_store_message,
        push=loop_module._push_messages,
        flower_supernode=flower_supernode,
    )


def supernode_heartbeat() -> SimpleNamespace:
    """Where a SuperNode's heartbeat interval lives: Flower hard-codes 30 s
    (``HEARTBEAT_DEFAULT_INTERVAL``), which the node sends to the SuperLink at activation and with
    every heartbeat (the SuperLink marks it offline after ``HEARTBEAT_PATIENCE`` intervals) and
    which paces its heartbeat thread; both modules read the name when they use it. The range is
    the one the SuperLink accepts."""
    import flwr.supercore.heartbeat as sender
    import flwr.supernode.fleet_http_connection as connection
    from flwr.common.constant import HEARTBEAT_MAX_INTERVAL, HEARTBEAT_MIN_INTERVAL, HEARTBEAT_PATIENCE

    return SimpleNamespace(
        modules=(connection, sender),
        name="HEARTBEAT_DEFAULT_INTERVAL",
        low=HEARTBEAT_MIN_INTERVAL,
        high=HEARTBEAT_MAX_INTERVAL,
        patience=HEARTBEAT_PATIENCE,
    )


def parse_run_config(values: list[str]) -> dict[str, Any]:
    """``flwr run --run-config`` values parsed as Flower parses them (``k=v`` TOML pairs or a
    ``.toml`` file): what ``pflower run`` checks before it starts anything."""
    import click
    from flwr.common.config import parse_config_args

    try:
        return parse_config_args(values)
    except click.ClickException as exc:  # Flower's CLI error: one line here, not a traceback
        bad = [v for v in values if not _parses(v)]
        shown = f" {bad[0]!r}" if bad else ""
        raise ValueError(
            f"--run-config{shown} is not Flower's run-config syntax: space-separated key=value pairs whose values "
            "are TOML (a string in quotes: \"method='fedper' lr=0.01\"), or a .toml file"
        ) from exc


def _parses(value: str) -> bool:
    from flwr.common.config import parse_config_args

    try:
        parse_config_args([value])
        return True
    except Exception:  # noqa: BLE001 - any refusal counts as not parsing
        return False


def clientapp_runtime() -> SimpleNamespace:
    """What ``flwr-clientapp --token`` runs, for the fork server's children (client_app.forkserver):
    ``run_clientapp(runtime_api_address, token, insecure, certificates, parent_pid,
    runtime_dependency_install)`` and ``validate_and_resolve_root_certificates(path, insecure)``."""
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    return SimpleNamespace(
        run_clientapp=run_clientapp, validate_and_resolve_root_certificates=validate_and_resolve_root_certificates
    )


def superexec() -> SimpleNamespace:
    """Flower's SuperExec parts the warm ClientApps plug into (client_app.forkserver): its subprocess
    executor, the spec of a task it launches, task and executor types, a launch's result, the
    loop module whose ``get_executor`` (and, serving several SuperNodes, ``register_signal_handlers``)
    pflower wraps, the command's module whose ``run_superexec`` it fans out, Flower's
    ``add_exit_handler``, where its FLWR_HOME is, and the ``flower-superexec`` entry point."""
    import importlib

    from flwr.supercore.constant import ExecutorType, TaskType
    from flwr.supercore.exit import add_exit_handler
    from flwr.supercore.superexec import run_superexec as loop
    from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor
    from flwr.supercore.superexec.executor.types import ExecutionSpec, LaunchResult
    from flwr.supercore.utils import get_flwr_home

    # the command's module (its package re-exports the function under the same name)
    cli = importlib.import_module("flwr.supercore.cli.flower_superexec")
    return SimpleNamespace(
        SubprocessExecutor=SubprocessExecutor,
        ExecutionSpec=ExecutionSpec,
        TaskType=TaskType,
        ExecutorType=ExecutorType,
        LaunchResult=LaunchResult,
        loop=loop,
        cli=cli,
        add_exit_handler=add_exit_handler,
        flwr_home=get_flwr_home,
        flower_superexec=cli.flower_superexec,
    )


def wire_measures() -> SimpleNamespace:
    """How Flower puts a Message on the wire, for the communication benchmark: the whole message as
    one protobuf (``message_to_proto``), its header alone (``remove_content_from_message``), and the
    object tree and content-addressed objects it pushes (``get_object_tree``,
    ``get_all_nested_objects``, hashing each once inside ``no_object_id_recompute()``)."""
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
        no_object_id_recompute,
    )

    return SimpleNamespace(
        message_to_proto=message_to_proto,
        remove_content_from_message=remove_content_from_message,
        get_all_nested_objects=get_all_nested_objects,
        get_object_tree=get_object_tree,
        no_object_id_recompute=no_object_id_recompute,
    )


def ray_bootstrap_address(address: str) -> str:
    """What ``ray.init(address="auto")`` resolves ``auto`` to: the cluster started on this machine
    (simulation.simulate checks it answers before Ray starts); ConnectionError when there is none."""
    from ray._private.services import canonicalize_bootstrap_address

    return canonicalize_bootstrap_address(address)


def flwr_cli() -> SimpleNamespace:
    """Flower's command line (``flwr``) and the module-level ``collect_files`` its FAB build calls
    (``flwr.cli.build``; server_app.flwr_cli walks the app without entering ignored folders)."""
    import flwr.cli.build as build
    from flwr.cli.app import app

    return SimpleNamespace(app=app, build=build, collect_files=build.collect_files)
