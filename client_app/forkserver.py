"""``pflower-superexec``: a ClientApp SuperExec that forks every ClientApp from a warm process.

Flower 1.41 runs each message to a SuperNode in a fresh ``flwr-clientapp`` process: Python
starts, imports Flower and torch (2-3 s on a desktop core, far more on an edge board), and
only then trains. This SuperExec does what ``flower-superexec`` does (same flags, same
Runtime API protocol, same task loop: it *is* Flower's loop) except how a ClientApp task
process starts: a fork server (Python's ``multiprocessing`` ``forkserver``) imports torch,
numpy and Flower's ClientApp runtime once, and each task is a ``fork()`` of it that runs
Flower's own ``run_clientapp``. The ClientApp code itself still comes from the run's FAB,
loaded in the forked child as ``flwr-clientapp`` would, so a new FAB needs no restart.

Use it with a SuperNode in ``--isolation process`` (the SuperNode then starts no SuperExec
of its own)::

    flower-supernode ... --isolation process --port 9094
    pflower-superexec --runtime-api-address 127.0.0.1:9094 --insecure

One ``pflower-superexec`` may serve several SuperNodes on the same host (a gateway for several
devices, a test bench): ``--runtime-api-address`` repeated or comma-separated. It then runs
Flower's task loop once per SuperNode, each in a thread of its own, and forks every ClientApp
from its one fork server: torch is imported once for all of them instead of once a node
(benchmarks/results/many_nodes.md measures what that saves). A loop that ends stops them all.

Why a fork server and not a fork of this process: the SuperExec holds an HTTP client and
threads; forking a threaded process can deadlock the child. The fork server is a separate,
single-threaded process that only imports; it never runs torch, so no OpenMP pool or CUDA
context exists when it forks (each child sets its own threads and device).

What it cannot keep warm: anything the ClientApp builds per message (data, model) — the
partition cache (``federated_data/node_cache.py``) covers the data.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# imported by the fork server once, before it forks any ClientApp (import names, comma-separated
# on the command line). Our own packages are left out on purpose: the child loads them from the
# run's FAB, as Flower does, so the code that runs is the code that was submitted.
DEFAULT_PRELOAD = ("torch", "numpy", "flwr.supernode.runtime.run_clientapp")
PRELOAD_FLAG = "--preload"
# Flower's flag for the SuperNode's Runtime API (and its old name); pflower-superexec takes it
# repeated or comma-separated, one address per SuperNode it serves
ADDRESS_FLAGS = ("--runtime-api-address", "--appio-api-address")
# this project's one import name (pyproject.toml): a forked child drops any copy it inherited,
# so that Flower's loader imports it from the run's FAB, as in a fresh flwr-clientapp process
APP_PACKAGES = frozenset({"pflower"})


def forget_app_modules() -> list[str]:
    """Remove this project's modules from ``sys.modules`` (the child got them from the fork server
    or from unpickling its target); returns what was removed."""
    gone = [name for name in sys.modules if name.partition(".")[0] in APP_PACKAGES]
    for name in gone:
        del sys.modules[name]
    return gone


def _run_clientapp_task(
    runtime_api_address: str,
    token: str,
    insecure: bool,
    root_certificates_path: str | None,
    parent_pid: int | None,
    runtime_dependency_install: bool,
    suppress_output: bool,
    flwr_home: str | None = None,
) -> None:
    """The body of one forked ClientApp process: what ``flwr-clientapp --token ...`` runs;
    ``flwr_home``: where it installs the run's FAB (one directory per SuperNode served)."""
    if flwr_home is not None:
        os.environ["FLWR_HOME"] = flwr_home
    if suppress_output:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    from pflower.compat import clientapp_runtime

    runtime = clientapp_runtime()
    forget_app_modules()

    runtime.run_clientapp(
        runtime_api_address=runtime_api_address,
        token=token,
        insecure=insecure,
        certificates=runtime.validate_and_resolve_root_certificates(root_certificates_path, insecure),
        parent_pid=parent_pid,
        runtime_dependency_install=runtime_dependency_install,
    )


def _preloaded(modules: Sequence[str]) -> None:
    """Runs in a forked child at start-up: exit 3 when a preload module did not import."""
    missing = [m for m in modules if m not in sys.modules]
    if missing:
        sys.stderr.write(f"pflower-superexec: not preloaded: {', '.join(missing)}\n")
        raise SystemExit(3)


class ForkserverExecutor:
    """Flower's ``Executor`` protocol: ClientApp tasks forked from the fork server, every other
    task type (a SuperExec may serve ServerApps too) started as Flower starts it.

    ``multiprocessing`` keeps one fork server per process, started with the preload list of the
    first executor that forks: one executor per process (the command makes one)."""

    def __init__(self, preload: Sequence[str] = DEFAULT_PRELOAD) -> None:
        from pflower.compat import superexec

        self._flower = superexec()
        self.preload = tuple(preload)
        self._fallback = self._flower.SubprocessExecutor()
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(list(self.preload))
        self._running: list[Any] = []
        self._lock = threading.Lock()  # several task loops (one per SuperNode served) share it
        # Runtime API address -> the FLWR_HOME its ClientApps install FABs into. Flower's install
        # returns early when the app's directory exists, while another process may still be
        # copying into it: two SuperNodes' ClientApps forked at once for the same run must not
        # share one (serve_several sets this; one SuperNode: the process's own FLWR_HOME)
        self.homes: dict[str, str] = {}

    def warm_up(self, timeout: float = 120.0) -> None:
        """Start the fork server now (not on the first message) and check its imports."""
        probe = self._ctx.Process(target=_preloaded, args=(self.preload,), name="pflower-forkserver-probe")
        probe.start()
        probe.join(timeout)
        if probe.exitcode != 0:
            raise RuntimeError(
                f"the fork server could not import {list(self.preload)} (exit code {probe.exitcode}); "
                f"install them in this environment or pass {PRELOAD_FLAG} with modules it has"
            )

    # --- Flower's Executor protocol -------------------------------------------------------
    def get_eligible_capacity(self, supported_task_types: set[Any], **kwargs: Any) -> tuple[set[Any], set[str]]:
        return self._fallback.get_eligible_capacity(supported_task_types, **kwargs)

    def wait_for_capacity(self, task_type: Any = None, **kwargs: Any) -> None:
        return self._fallback.wait_for_capacity(task_type, **kwargs)

    def launch(self, spec: Any) -> Any:
        TaskType, LaunchResult = self._flower.TaskType, self._flower.LaunchResult
        if spec.task_type != TaskType.CLIENT_APP:
            return self._fallback.launch(spec)
        proc = self._ctx.Process(
            target=_run_clientapp_task,
            args=(
                spec.runtime_api_address,
                spec.token,
                spec.insecure,
                spec.root_certificates_path,
                spec.parent_pid,
                spec.runtime_dependency_install,
                spec.suppress_output,
                self.homes.get(spec.runtime_api_address),
            ),
            name=f"flwr-clientapp-task-{spec.task_id}",
        )
        with self._lock:
            try:
                proc.start()
            except OSError as err:  # the fork server died or cannot fork: Flower expires the task
                return LaunchResult.failed(f"forking a ClientApp failed: {err}")
            self._running.append(proc)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Forget finished ClientApps (the fork server reaps them)."""
        with self._lock:
            self._running = [p for p in self._running if p.is_alive()]

    def close(self) -> None:
        """Leave running ClientApps to finish, as Flower's subprocess executor does."""
        self._fallback.close()

    @property
    def running(self) -> int:
        self.reconcile()
        return len(self._running)


def take_option(
    argv: Sequence[str], flags: Sequence[str], needs: str, program: str = "pflower-superexec"
) -> tuple[list[str], list[str]]:
    """Take every ``FLAG VALUE`` and ``FLAG=VALUE`` of ``flags`` out of a command line: (the values
    in order, the rest, left for Flower's parser). A flag without its value exits saying it
    ``needs`` one."""
    values: list[str] = []
    rest: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        flag = next((f for f in flags if arg == f or arg.startswith(f + "=")), None)
        if flag is None:
            rest.append(arg)
            i += 1
        elif arg == flag:
            if i + 1 >= len(args):
                raise SystemExit(f"{program}: {flag} needs {needs}")
            values.append(args[i + 1])
            i += 2
        else:
            values.append(arg.split("=", 1)[1])
            i += 1
    return values, rest


def split_preload(argv: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
    """Take ``--preload a,b`` (or ``--preload=a,b``; the last one given counts) out of the command
    line; the rest is ``flower-superexec``'s."""
    values, rest = take_option(argv, [PRELOAD_FLAG], "a comma-separated list of modules")
    if not values:
        return DEFAULT_PRELOAD, rest
    return tuple(m.strip() for m in values[-1].split(",") if m.strip()), rest


def split_addresses(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Take every ``--runtime-api-address`` value (repeated, or comma-separated) out of the
    command line: (the addresses in order, the rest)."""
    values, rest = take_option(argv, ADDRESS_FLAGS, "an address (host:port, or several comma-separated)")
    addresses = [a.strip() for value in values for a in value.split(",") if a.strip()]
    duplicates = sorted({a for a in addresses if addresses.count(a) > 1})
    if duplicates:
        raise SystemExit(f"pflower-superexec: {', '.join(duplicates)} given twice: serve each SuperNode once")
    return addresses, rest


def fan_out(
    addresses: Sequence[str],
    run_one: Callable[..., None],
    stop_all: Callable[[], None],
    log: logging.Logger | None = None,
) -> Callable[..., None]:
    """``run_superexec(**kwargs)`` for several SuperNodes: the first address's loop in this
    (the main) thread, as Flower runs it (its signal handlers and health server are the
    process's), every other address's in a thread of its own with the same settings and no
    health server. A thread's loop that ends, normally or not, is logged and ``stop_all()`` is
    called: one SuperNode left unserved is not a state to run on in silence."""
    log = log or logging.getLogger("pflower.superexec")

    def run_all(**kwargs: Any) -> None:
        for address in addresses[1:]:

            def serve(address: str = address) -> None:
                try:
                    run_one(**{**kwargs, "runtime_api_address": address, "health_server_address": None})
                    why = "ended"
                except BaseException as err:  # SystemExit from Flower's flwr_exit too
                    why = f"ended with {type(err).__name__}: {err}"
                log.error("pflower-superexec: the task loop for SuperNode %s %s; stopping every loop", address, why)
                stop_all()

            threading.Thread(target=serve, name=f"superexec-{address}", daemon=True).start()
        run_one(**{**kwargs, "runtime_api_address": addresses[0]})

    return run_all


def thread_aware(register: Callable[..., None], add_exit_handler: Callable[[Callable[[], None]], None]) -> Callable:
    """Flower's ``register_signal_handlers`` for loops in threads: the main thread's call
    registers the signals as Flower does; a thread's (where ``signal.signal`` raises) adds its
    exit handlers (its client's close) to Flower's list, so one SIGTERM closes every loop."""

    def register_signal_handlers(*args: Any, exit_handlers: Sequence[Callable[[], None]] | None = None, **kwargs: Any):
        if threading.current_thread() is threading.main_thread():
            return register(*args, exit_handlers=list(exit_handlers or []), **kwargs)
        for handler in exit_handlers or []:
            add_exit_handler(handler)
        return None

    return register_signal_handlers


def node_homes(addresses: Sequence[str], flwr_home: Path) -> dict[str, str]:
    """One FLWR_HOME per SuperNode served, under the process's: ``<home>/superexec-<host>-<port>``."""
    return {a: str(flwr_home / ("superexec-" + re.sub(r"[^A-Za-z0-9.]+", "-", a).strip("-"))) for a in addresses}


def serve_several(addresses: Sequence[str], executor: ForkserverExecutor) -> None:
    """Make Flower's ``flower-superexec`` run one task loop per SuperNode address (:func:`fan_out`),
    each SuperNode's ClientApps installing FABs in a FLWR_HOME of their own (:func:`node_homes`)."""
    from pflower.compat import superexec

    flower = superexec()
    executor.homes = node_homes(addresses, flower.flwr_home())
    flower.loop.register_signal_handlers = thread_aware(flower.loop.register_signal_handlers, flower.add_exit_handler)
    flower.cli.run_superexec = fan_out(
        addresses, flower.cli.run_superexec, lambda: os.kill(os.getpid(), signal.SIGTERM)
    )


def install(executor: ForkserverExecutor) -> None:
    """Make Flower's SuperExec loop start its subprocess-type tasks with ``executor``."""
    from pflower.compat import superexec

    flower = superexec()
    ExecutorType, loop = flower.ExecutorType, flower.loop

    if not callable(getattr(loop, "get_executor", None)):
        import flwr

        raise SystemExit(
            f"pflower-superexec: this flwr ({getattr(flwr, '__version__', '?')}) has no SuperExec executor "
            "hook (flwr 1.41 has); run flower-superexec instead (a fresh process per message)"
        )
    flower_get_executor = loop.get_executor

    def get_executor(executor_type: Any, executor_config: Any = None, **kwargs: Any) -> Any:
        if executor_type == ExecutorType.SUBPROCESS:
            return executor
        return flower_get_executor(executor_type, executor_config, **kwargs)

    loop.get_executor = get_executor


def main(argv: Sequence[str] | None = None) -> None:
    """``pflower-superexec [--preload m1,m2] --runtime-api-address A[,B...] <flower-superexec flags>``."""
    preload, rest = split_preload(sys.argv[1:] if argv is None else argv)
    addresses, rest = split_addresses(rest)
    if addresses:  # Flower's parser sees one address; a second one and more are served by fan_out
        rest = [ADDRESS_FLAGS[0], addresses[0], *rest]
    executor = ForkserverExecutor(preload)
    if len(addresses) > 1:
        serve_several(addresses, executor)
    if "-h" in rest or "--help" in rest:  # our flag first, then flower-superexec's help
        print(
            __doc__.split("\n\n")[0] + f"\n\n{PRELOAD_FLAG} M1,M2  modules the fork server imports once "
            f"(default: {','.join(DEFAULT_PRELOAD)})\n{ADDRESS_FLAGS[0]} A,B  one address or several: one task "
            "loop per SuperNode, one fork server for all\nEvery other flag is flower-superexec's:\n"
        )
    else:
        try:
            executor.warm_up()
        except RuntimeError as err:
            raise SystemExit(f"pflower-superexec: {err}") from None
    install(executor)
    from pflower.compat import superexec

    sys.argv = ["pflower-superexec", *rest]
    superexec().flower_superexec()


if __name__ == "__main__":
    main()
