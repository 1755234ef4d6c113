"""The parallel engine (``backend=parallel``) writes the serial engine's numbers bit for bit, for
every method: its short run equals ``pinned_numbers.json``, which the serial engine wrote (the
pinned test proves that). Also across a resume, whichever engine ran the first half: a node's
state moves with its task between worker processes and back."""

from __future__ import annotations

import json

import pytest
import torch
from grid_faults import Crash, CrashingGrid

from pflower.server_app.results import read_metrics
from pflower.server_app.run_plan import plan_run
from pflower.server_app.runner import run_experiment
from pflower.simulation.inprocess import InProcessGrid
from pflower.simulation.parallel import ParallelGrid
from pinned.cases import CASES, fingerprint, first_difference, load_pinned, overrides, run_case

PINNED = load_pinned()


def parallel(n: int) -> ParallelGrid:
    return ParallelGrid(n, workers=2, client_threads=1)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_the_parallel_engine_writes_the_pinned_numbers(case):
    """With the clients' state in memory only (``client_state_dir=null``), so a node's state
    reaches its next worker only in the Context that travels with its task."""
    diff = first_difference(PINNED[case], run_case(case, parallel, extra=("client_state_dir=null",)))
    assert diff is None, f"{case}: the parallel engine's numbers differ from the serial engine's at {diff}"


class CrashingParallelGrid(CrashingGrid, ParallelGrid):
    """The parallel engine, killed when round ``crash_at``'s train messages are sent."""


@pytest.mark.parametrize("first_half", ["parallel", "serial"])
@pytest.mark.parametrize("case", ["ditto", "fedcpmd", "kapc", "velo"])
@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_a_resume_across_engines_equals_the_uninterrupted_run(case, first_half, tmp_path):
    """Methods with persistent client state (Ditto's personal model, FedCPMD's per-client layer,
    KAPC's cube, Velo's CVAE on the server): crash after round 2 on one engine, resume on the other."""
    out = tmp_path / "out"
    plan = plan_run([*overrides(case), f"output_dir={out}"])
    n = plan.run.num_clients
    crashing = (
        CrashingParallelGrid(n, workers=2, client_threads=1, crash_at=3)
        if first_half == "parallel"
        else CrashingGrid(n, record=False, client_threads=1, crash_at=3)
    )
    with pytest.raises(Crash):
        run_experiment(crashing, plan)
    crashing.close()
    (run_dir,) = [p for p in out.glob("*/*") if p.is_dir()]
    second = InProcessGrid(n, record=False, client_threads=1) if first_half == "parallel" else parallel(n)
    try:
        summary = run_experiment(second, plan_run([*overrides(case), f"output_dir={out}", f"resume={run_dir}"]))
    finally:
        second.close()
    got = fingerprint(read_metrics(run_dir), {k: v for k, v in summary.items() if not k.startswith("resumed_after")})
    diff = first_difference(PINNED[case], json.loads(json.dumps(got)))
    assert diff is None, f"{case}: crash on {first_half}, resume on the other engine: differs at {diff}"


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_workers_serve_any_node_and_the_state_comes_back(tmp_path):
    """Two workers, six nodes, FedPer: after the run every node's Context in the parent holds the
    personal head its worker saved (the parent's copy was replaced, not left stale)."""
    from pflower.simulation.inprocess import personal_state

    plan = plan_run([*overrides("fedper"), "fraction=1.0", "rounds=1", f"output_dir={tmp_path}"])
    grid = parallel(6)
    before = dict(grid.contexts)
    try:
        run_experiment(grid, plan)
        for node, ctx in grid.contexts.items():
            assert ctx is not before[node] and personal_state(ctx) is not None
        assert len(grid.busy_s) == 12  # 6 train + 6 final evaluate tasks ran on the workers
    finally:
        grid.close()
    assert grid._pool is None


def test_bad_worker_counts_are_refused():
    from pflower.server_app.config import CUDA_AUTO_WORKERS, default_workers, resolve_workers

    assert resolve_workers("auto") == default_workers() and resolve_workers(3) == 3 and resolve_workers("2") == 2
    assert resolve_workers("auto", on_cuda=True) == min(default_workers(), CUDA_AUTO_WORKERS)
    assert resolve_workers(12, on_cuda=True) == 12  # a count given is a count kept
    for bad in (0, -1, "two", 1.5, "1.5"):
        with pytest.raises(ValueError, match="workers must be 'auto' or a positive integer"):
            resolve_workers(bad)


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_workers_started_from_a_fork_server_write_the_pinned_numbers():
    """The start used when the ServerApp's process already holds a CUDA context (no fork of it):
    workers load their own data; the numbers do not change."""
    from pinned.numerics import disable_mkldnn

    def grid(n: int) -> ParallelGrid:  # a fresh interpreter: the pinned numerics set again in each worker
        return ParallelGrid(n, workers=2, client_threads=1, start_method="forkserver", worker_setup=disable_mkldnn)

    diff = first_difference(PINNED["ditto"], run_case("ditto", grid, extra=("client_state_dir=null",)))
    assert diff is None, f"ditto on fork-server workers differs at {diff}"


@pytest.mark.parametrize(
    "cuda_ready, run_device, node_devices, expected",
    [
        (False, "cpu", (None, None), "fork"),
        (True, "cpu", (None, None), "forkserver"),
        (False, "cuda", (None, None), "forkserver"),
        (False, "cpu", ("cuda", None), "forkserver"),
        (False, "cuda", ("cpu", "cpu"), "fork"),
    ],
)
def test_the_start_follows_whether_the_clients_use_cuda(monkeypatch, cuda_ready, run_device, node_devices, expected):
    """The GPU case without a GPU: workers that will compute on CUDA (the run's device, or a
    node's own ``device``), or whose parent already holds a CUDA context, must not be forked
    (a child forked after the parent touched CUDA cannot use it: on an H100 every forked
    worker's client failed), so they come from a fork server; CPU clients are forked (shared
    pages). The choice is made when the pool starts."""
    import multiprocessing
    from types import SimpleNamespace

    import pflower.client_app.node as client_node
    import pflower.client_app.runtime as client_runtime
    from pflower.simulation import parallel as parallel_module

    monkeypatch.setattr(client_runtime, "parse_spec", lambda msg: SimpleNamespace(device=run_device))
    # node_device checks a named CUDA device against this machine's: none here
    monkeypatch.setattr(client_node.torch.cuda, "device_count", lambda: 1)

    started: list[str] = []

    class FakePool:
        def close(self) -> None: ...

        def join(self) -> None: ...

    class FakeContext:
        def __init__(self, method: str) -> None:
            self.method = method

        def Pool(self, workers, initializer=None, initargs=()):  # noqa: N802 - multiprocessing's name
            started.append(self.method)
            return FakePool()

    monkeypatch.setattr(parallel_module, "_cuda_initialized", lambda: cuda_ready)
    monkeypatch.setattr(multiprocessing, "get_context", FakeContext)
    grid = ParallelGrid(2, workers=2, client_threads=1, preload=lambda msg, ctx: 1)
    for ctx, device in zip(grid.contexts.values(), node_devices):
        if device is not None:  # a node pinned to its own device (node config)
            ctx.node_config["device"] = device
    grid._start(None)
    grid.close()  # and gc.unfreeze() after the fork path's gc.freeze()
    assert started == [expected]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CI has none): run it on a GPU machine")
@pytest.mark.parametrize("start", ["auto", "forkserver"])
@pytest.mark.parametrize("case", ["fedavg", "ditto", "fedcmd"])
def test_workers_sharing_one_gpu_write_the_serial_engines_numbers(case, start):
    """Three workers training on one GPU, each with its own CUDA context, under deterministic
    kernels, write what the serial engine writes on that GPU. ``auto``: the start the engine
    picks for CUDA clients (a fork server, also while this process holds no CUDA context yet: a
    fork after torch was asked about the GPU cannot use it). Ditto keeps a personal model per
    client, FedCMD its layer scores. Passed on an H100 (benchmarks/results/engines_gpu/)."""
    extra = ("device=cuda", "deterministic=true", "client_state_dir=null")
    made: list[ParallelGrid] = []

    def on_gpu(n: int) -> ParallelGrid:
        made.append(ParallelGrid(n, workers=3, client_threads=1, start_method=None if start == "auto" else start))
        return made[-1]

    try:
        got = run_case(case, on_gpu, extra=extra)
        expected = run_case(case, extra=extra)
    finally:
        torch.use_deterministic_algorithms(False)  # deterministic=true set it in this process
    print(f"{case}: workers started by {made[0].started_with}")
    assert made[0].started_with == "forkserver"
    diff = first_difference(expected, got, rel=0.0)
    assert diff is None, f"{case}: workers on one GPU differ from the serial engine on it at {diff}"


def test_a_worker_gives_its_heap_back_only_past_what_its_tasks_reuse():
    """Trimming after every task made the next one fault its buffers in again (an evaluation
    12.7 ms against 7.8): a worker keeps up to TRIM_ABOVE of free heap past what it started with."""
    from pflower.simulation.parallel import TRIM_ABOVE, _free_heap, should_trim

    mib = 1 << 20
    assert not should_trim(40 * mib, 39 * mib)  # the workload's steady state: never trimmed
    assert not should_trim(39 * mib + TRIM_ABOVE, 39 * mib)
    assert should_trim(40 * mib + TRIM_ABOVE, 39 * mib)  # a task that once needed much more
    assert should_trim(None, 39 * mib) and should_trim(40 * mib, None)  # unreadable: trim, as before
    if _free_heap() is not None:  # glibc >= 2.33: the free heap is read, and grows by what is freed
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        blocks = [libc.malloc(64 << 10) for _ in range(400)]  # below the mmap threshold: heap blocks
        free = _free_heap()
        for block in blocks[:-1]:  # the last one keeps the freed ones from being the heap's top
            libc.free(block)
        assert _free_heap() - free >= 20 * mib
        libc.free(blocks[-1])
