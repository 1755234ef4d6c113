"""Run one composed config in-process: ``pflower sim``'s engines (parallel, serial, batched, Ray), shared
by the ``pflower`` command and ``pflower leaderboard``."""

from __future__ import annotations

import os
import threading
import warnings
from logging import INFO
from typing import TYPE_CHECKING, Any

from flwr.common import log

from pflower.server_app.config import ConfigError
from pflower.server_app.interrupt import RunInterrupted, below_at_ctrl_c, descendants, end_processes
from pflower.server_app.progress import Sweep
from pflower.server_app.run_plan import EngineSettings, RunPlan

if TYPE_CHECKING:
    from pflower.server_app.runner import PreparedRun


def simulate(plan: RunPlan, sweep: Sweep | None = None) -> dict[str, Any]:
    """Run one planned run (:func:`server_app.run_plan.plan_run`) on the engine it names: Flower's
    simulation engine (Ray) in this process, or an in-process Grid (``backend=serial``,
    ``parallel``, ``batched``). ``sweep``: the run's place in a ``pflower sim -m`` sweep (for the
    progress lines).
    """
    from pflower.server_app.runner import prepare_run

    prepared = prepare_run(plan)  # the strategy built once, a bad option refused before an engine starts
    try:
        return _simulate(prepared, sweep)
    except BaseException:
        prepared.discard(before_start=True)  # an engine that failed before the run began leaves nothing
        raise


def _simulate(prepared: PreparedRun, sweep: Sweep | None) -> dict[str, Any]:
    from pflower.server_app.runner import run_experiment

    engine, num_clients = prepared.plan.engine, prepared.plan.run.num_clients
    if engine.in_process:  # no Ray
        from pflower.client_app.grouped_training import role_has_plans
        from pflower.server_app.config import resolve_workers

        from .batched import BatchedGrid
        from .inprocess import InProcessGrid
        from .parallel import ParallelGrid

        # the ServerApp and every client in this process (serial: one after the other in client-id
        # order) or in worker processes forked from it (parallel): each node keeps its Context
        # across rounds as a SuperNode does, each client runs on one torch thread as a Ray actor
        # with client-resources num_cpus=1 does: the same numbers on every engine
        if engine.backend == "serial":
            grid = InProcessGrid(num_clients, record=False, client_threads=1)
        elif engine.backend == "batched" and role_has_plans(prepared.strategy.traits.role):
            # one process, a round's clients as grouped computations
            grid = BatchedGrid(num_clients, engine.batch_clients, threads=resolve_workers(engine.workers))
        else:
            if engine.backend == "batched":  # every client would train alone: the parallel engine does that faster
                log(
                    INFO,
                    "batched engine: client role %s has no FitPlan, so its clients train one at a time; "
                    "the run goes to the parallel engine",
                    prepared.strategy.traits.role,
                )
            from pflower.client_app.runtime import computes_on_cuda

            on_cuda = computes_on_cuda(engine.device)
            grid = ParallelGrid(num_clients, resolve_workers(engine.workers, on_cuda), client_threads=1)
        try:
            return run_experiment(grid, prepared, sweep=sweep)
        finally:
            grid.close()
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation  # imports Ray: only on this engine

    from pflower.client_app.app import app as client_app
    from pflower.server_app.failures import USER_ERRORS

    backend = ray_backend_config(engine)
    out: dict[str, Any] = {}
    refused: list[Exception] = []
    stopped: list[RunInterrupted] = []
    ended = threading.Event()
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        try:
            out.update(run_experiment(grid, prepared, sweep=sweep))
        except USER_ERRORS as exc:  # one line from pflower, not Flower's traceback
            refused.append(exc)
        except RunInterrupted as exc:  # Ctrl-C, seen by this thread at its next poll (messaging.STOP)
            stopped.append(exc)
        finally:
            ended.set()

    # run_simulation is deprecated in flwr 1.41 in favour of `flwr run`, but it is the only
    # in-process entry (a sweep runs several ServerApps in this process); pflower.logs drops
    # the warning. Ray's FutureWarning about accelerator env vars concerns num_gpus=0 actors only.
    warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
    try:
        run_simulation(server_app=server_app, client_app=client_app, num_supernodes=num_clients, backend_config=backend)
    except KeyboardInterrupt:  # in this thread; the ServerApp's own stops at its next poll (within a second)
        ended.wait(timeout=15)
        _shut_ray_down()
        if stopped:
            raise stopped[0] from None
        raise
    if stopped:  # the Ctrl-C reached the ServerApp's thread alone (STOP): Flower's teardown ran
        _shut_ray_down()
        raise stopped[0]
    if refused:
        raise refused[0]
    if not out:
        raise RuntimeError("the simulation ended without a result; see the log above for the ServerApp's error")
    return out


def _shut_ray_down() -> None:
    """End this process's Ray (its raylet, GCS and actors) after a Ctrl-C cut Flower's own teardown short.

    Flower's own ``ray.shutdown()`` (in its ``finally``) ends the raylet; its ClientApp actors notice
    only later (seconds on a loaded machine) and by then belong to no one: the processes below this
    one at the Ctrl-C are ended if they outlive it."""
    ours = sorted(set(below_at_ctrl_c()) | set(descendants(os.getpid())))
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass
    end_processes(ours, grace_s=2.0)


def _gpu_share() -> float:
    try:
        import torch

        return 0.25 if torch.cuda.is_available() else 0.0
    except ImportError:
        return 0.0


def ray_backend_config(engine: EngineSettings) -> dict[str, Any]:
    """Flower's Ray backend settings from the ``ray`` keys: per-ClientApp resources, and with
    ``ray.address`` the running cluster to join (checked first: a bad address fails in seconds
    with one line, not after Ray's minute of retries)."""
    gpus = engine.ray_client_gpus
    resources = {
        "num_cpus": engine.ray_client_cpus,
        "num_gpus": _gpu_share() if gpus == "auto" else float(gpus),
    }
    init_args: dict[str, Any] = {"log_to_driver": True}
    if engine.ray_address:
        init_args["address"] = check_ray_address(engine.ray_address)
    return {"client_resources": resources, "init_args": init_args}


def check_ray_address(address: str, timeout: float = 3.0) -> str:
    """The cluster address to pass to ``ray.init``, after checking that a Ray head answers there:
    ``auto`` must find a cluster started on this machine (``ray start --head``); ``HOST:PORT``
    must accept a connection within ``timeout`` seconds."""
    import socket

    if address == "auto":
        # what ray.init(address="auto") itself calls to find the cluster started on this machine
        from pflower.compat import ray_bootstrap_address

        try:
            found = ray_bootstrap_address("auto")
        except ConnectionError:
            found = None
        if not found:
            raise ConfigError(
                "ray.address=auto: no Ray cluster was started on this machine; start one with "
                "`ray start --head` or give the head's HOST:PORT"
            ) from None
        return found
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            f"ray.address={address!r} is not HOST:PORT (the head's GCS address, e.g. 10.0.0.5:6379) or auto"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(
            f"ray.address={address}: no Ray head answers there ({exc.strerror or exc}); start one with "
            f"`ray start --head --port {port}` on that machine, or fix the address"
        ) from None
    return address
