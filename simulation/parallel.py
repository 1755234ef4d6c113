"""The parallel engine of ``pflower sim`` (``backend=parallel``): the serial engine's in-process
Grid, with each batch of messages handled by N worker processes.

Why not Ray on one machine: Ray's start-up (~14 s here) and its idle workers (~2.4 GiB) cost more
than the parallelism gives on a small machine. Here the workers are ``fork()``s of the
ServerApp's process made after every client's data and the initial model are loaded, so all of
them share those pages (copy-on-write) instead of loading their own copies.

How a batch runs: the parent sends each task (message + the node's Context) to a free worker,
largest client first (longest-processing-time first: train-set size), so the round ends when
the work does, not when the last large client starts late. A worker handles the message exactly
as the serial engine does (the same handler, one torch thread), and sends back the reply and
the node's updated Context, which replaces the parent's copy: a node's state moves with its
task, so any worker can serve any node in any round. The replies are returned in the order the
messages were sent (client-id order), so the strategy aggregates them in the same order and the
numbers equal the serial engine's (and Ray's) bit for bit.

CUDA: a child forked from a process that has touched CUDA cannot use CUDA, and asking whether
a GPU is present (``torch.cuda.is_available()``) is already a touch (measured on an H100: every
forked worker's client failed at its first CUDA call). So when the workers will compute on CUDA,
or the parent holds a CUDA context, they start from a fork server instead (each loads its own
data; they share the device, each with its own CUDA context). CPU runs fork.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import time
from collections.abc import Callable
from logging import INFO
from typing import Any

from flwr.app import Context, Message
from flwr.common import log

from .inprocess import InProcessGrid, handle_safely

START_METHODS = ("fork", "forkserver", "spawn")


def _worker_init(threads: int, setup: Callable[[], None] | None) -> None:
    import torch

    from pflower.server_app.interrupt import ignore_ctrl_c

    global _FREE_AT_START
    ignore_ctrl_c()  # a Ctrl-C reaches the whole process group: the parent ends the workers (terminate)
    torch.set_num_threads(threads)  # before any parallel region in this process (fork safety)
    if setup is not None:
        setup()
    _FREE_AT_START = _free_heap()


def _work(task: tuple[int, Message, Context, int]) -> tuple[int, Message, Context, float]:
    index, msg, ctx, threads = task
    t0 = time.perf_counter()
    reply = handle_safely(msg, ctx, threads)
    seconds = time.perf_counter() - t0
    _trim()
    return index, reply, ctx, seconds


# free heap a worker keeps for its next task before it gives it back to the system
TRIM_ABOVE = 64 << 20


def should_trim(free_now: int | None, free_at_start: int | None, keep: int = TRIM_ABOVE) -> bool:
    """Whether a worker gives its free heap back after a task: when the heap's free bytes grew
    more than ``keep`` past what they were when the worker started (a task that once needed
    much more than the others), or when they cannot be read (an older glibc: always, as before).

    Why not after every task: the next task would fault every page of its buffers in again,
    which made evaluations and rounds measurably slower for little memory (the measurement:
    docs/benchmarks.md, "Simulation engines")."""
    if free_now is None or free_at_start is None:
        return True
    return free_now - free_at_start > keep


def _trim() -> None:
    """Give the heap's free pages back to the system after a task when :func:`should_trim` says
    so. A no-op off glibc."""
    libc = _libc()
    if libc and should_trim(_free_heap(), _FREE_AT_START):
        libc.malloc_trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _free_heap() -> int | None:
    """Free bytes in this process's malloc arenas (glibc >= 2.33's ``mallinfo2``), or None."""
    libc = _libc()
    if not libc or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    return int(libc.mallinfo2().fordblks)


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC


_LIBC: Any = None
_FREE_AT_START: int | None = None


class ParallelGrid(InProcessGrid):
    """An :class:`InProcessGrid` whose train and evaluate batches run on ``workers`` processes.

    ``preload(msg, node)``: called in the parent for every node before the workers start, so the
    workers inherit what it loads (the runtime's per-process caches of data and initial model);
    returns the node's size for scheduling (larger first). ``start_method``: ``None`` picks
    ``fork``, or ``forkserver`` when the clients compute on CUDA or CUDA is initialised here.
    ``worker_setup``: a module-level function each worker calls once when it starts (a
    fork-server worker is a fresh interpreter: process-wide torch settings made here do not
    reach it)."""

    def __init__(
        self,
        num_nodes: int,
        workers: int,
        node_config: dict | None = None,
        record: bool = False,
        client_threads: int | None = 1,
        start_method: str | None = None,
        preload: Callable[[Message, Context], int] | None = None,
        worker_setup: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(num_nodes, node_config=node_config, record=record, client_threads=client_threads)
        if start_method is not None and start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {list(START_METHODS)}, got {start_method!r}")
        self.workers = workers
        self.start_method = start_method
        self.preload = preload or preload_client
        self.worker_setup = worker_setup
        self.size: dict[int, int] = {}  # node -> scheduling weight (train samples)
        self.busy_s: list[float] = []  # seconds of handler time per task (the benchmark's utilisation)
        self.started_with: str | None = None  # the start method the workers came from
        self._pool: Any = None

    def handle_all(self, tasks: list[tuple[Message, int]]) -> list[Message]:
        if self.workers <= 1 or len(tasks) <= 1 or tasks[0][0].metadata.message_type == "query":
            return super().handle_all(tasks)  # discovery is cheap, and starts no workers
        pool = self._start(tasks[0][0])
        order = sorted(range(len(tasks)), key=lambda i: (-self.size.get(tasks[i][1], 0), i))
        jobs = [(i, tasks[i][0], self.contexts[tasks[i][1]], self.client_threads or 1) for i in order]
        replies: list[Message | None] = [None] * len(tasks)
        try:
            for index, reply, ctx, seconds in pool.imap_unordered(_work, jobs, chunksize=1):
                self.contexts[tasks[index][1]] = ctx  # the node's state as its handler left it
                replies[index] = reply
                self.busy_s.append(seconds)
        except BaseException:  # Ctrl-C or a lost worker: the batch's tasks are gone, and close() would wait for them
            self.close(now=True)
            raise
        return replies  # type: ignore[return-value]

    def _start(self, first: Message) -> Any:
        if self._pool is not None:
            return self._pool
        method = self.start_method or ("forkserver" if _cuda_initialized() or self._on_cuda(first) else "fork")
        # every client's data and the model, loaded here: forked workers inherit them (shared
        # pages); a fork server's workers load their own, and the sizes still order the tasks
        for node, ctx in self.contexts.items():
            self.size[node] = self.preload(first, ctx)
        if method == "fork":
            # objects made so far move to a permanent generation the collector never walks: a
            # collection in a worker would otherwise write to every object's header and copy
            # each page it touches (the data and model pages stay shared)
            gc.collect()
            gc.freeze()
        self._pool = multiprocessing.get_context(method).Pool(
            self.workers, initializer=_worker_init, initargs=(self.client_threads or 1, self.worker_setup)
        )
        self.started_with = method
        log(INFO, "parallel engine: %d worker processes (%s)", self.workers, method)
        return self._pool

    def _on_cuda(self, first: Message) -> bool:
        """Whether any node's client will compute on CUDA (the run's ``device``, or a node's own)."""
        from pflower.client_app.runtime import computes_on_cuda, parse_spec

        try:
            spec = parse_spec(first)
        except Exception:  # noqa: BLE001 - not a pflower message: its handler reports that
            return False
        return any(computes_on_cuda(spec.device, dict(ctx.node_config)) for ctx in self.contexts.values())

    def close(self, now: bool = False) -> None:
        """Let the workers finish and end; ``now``: end them at once, their tasks dropped (a run
        stopped mid-round: waiting would hang on tasks an interrupt lost)."""
        if self._pool is not None:
            self._pool.terminate() if now else self._pool.close()
            self._pool.join()
            self._pool = None
            gc.unfreeze()

    def __del__(self) -> None:  # a grid dropped without close(): do not leave workers behind
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.terminate()


def preload_client(msg: Message, ctx: Context) -> int:
    """Load a node's data and the run's initial model into this process's caches (what the
    handler would load first); returns the node's train-set size. A node whose data cannot be
    loaded here weighs 0: its worker reports the error as the serial engine would."""
    from pflower.client_app.runtime import client_data, client_id_of, fresh_model, parse_spec

    try:
        spec = parse_spec(msg)
        fresh_model(spec)
        return int(client_data(spec, client_id_of(ctx), ctx.node_config).x_train.shape[0])
    except Exception:  # noqa: BLE001 - the handler raises it again, as a reply, where it belongs
        return 0


def _cuda_initialized() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
