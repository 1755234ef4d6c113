"""What a ClientApp process sets up once: its torch threads, its device warm-up, its cold start.

On a SuperNode, Flower starts a fresh ClientApp process for every message, so these run once
per message there and once per Ray actor (or once per ``pflower sim backend=serial``) in
simulation. They only apply on a deployed node (node config ``client-id``); in simulation the
engine owns the threads (a Ray actor with one CPU, or the serial backend's per-client setting).

- **Threads.** torch starts one thread per core in every process. Several SuperNodes on one host
  (the compose demo, a test rig, a multi-GPU box) then oversubscribe the cores: three nodes at 16
  threads each could not finish 5 LeNet epochs in 60 s where 5 threads each took 0.3 s. Node
  config ``torch-threads=N`` sets it; by default a node that shares its host with other SuperNodes
  takes its share of the usable cores (``cores // supernodes``, at least 1); a node alone keeps
  torch's default.
- **Device.** Node config ``device`` (``cpu``, ``cuda``, ``cuda:1``...) overrides the run's
  ``device`` for this node: a SuperNode pinned to one GPU of a multi-GPU host, or one that must
  stay on its CPU. (``CUDA_VISIBLE_DEVICES`` on the ``flower-supernode`` process does the same
  for every ClientApp it starts.)
- **Cold start.** Seconds from the process's start to its first message (Python, Flower, the
  FAB, torch): reported once per process (``cold_start_s``) so a round's cost can be split
  into start-up and work.
- **Device warm-up.** The first CUDA forward/backward of a process loads kernels and creates
  cuBLAS/cuDNN handles (0.9 s measured on an H100). It runs once on a throw-away copy of the
  model before the timed evaluation and is reported on its own (``device_setup_s``), so
  ``test_before``'s time is the evaluation's.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pflower.protocol import wire

THREADS_KEY = "torch-threads"  # node config: torch threads of this node's ClientApp processes
DEVICE_KEY = "device"  # node config: the torch device this node's ClientApps train on (overrides the run's)

_first_message_seen = False
_warm_devices: set[str] = set()


def is_deployed(node_config: Mapping[str, Any]) -> bool:
    """A SuperNode started by a user (``client-id``), not a simulated node (``partition-id``)."""
    return wire.NODE_CLIENT_ID in node_config


def process_age_s() -> float | None:
    """Seconds since this process started (Linux ``/proc``; None elsewhere)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def cold_start_s() -> float | None:
    """The process's age on its first message, None on every later one (a warm process)."""
    global _first_message_seen
    if _first_message_seen:
        return None
    _first_message_seen = True
    return process_age_s()


def forked_from_fork_server(cmdline: Path = Path("/proc/self/cmdline")) -> bool:
    """Whether this process is a fork of a ``multiprocessing`` fork server (pflower-superexec's,
    which imported torch before forking): a fork keeps its parent's command line, which names
    ``multiprocessing.forkserver``; a fresh ``flwr-clientapp`` process names itself."""
    try:
        return b"multiprocessing.forkserver" in cmdline.read_bytes()
    except OSError:
        return False


SUPERNODE_PROGRAMS = ("flower-supernode", "pflower-supernode")  # the latter: client_app/supernode.py


def supernodes_on_host(proc: Path = Path("/proc")) -> int:
    """``flower-supernode`` (or ``pflower-supernode``) processes this process can see (any user; the
    program, or a Python running it); at least 1."""
    count = 0
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")[:2]
        except OSError:
            continue
        if any(Path(a.decode(errors="replace")).name in SUPERNODE_PROGRAMS for a in argv):
            count += 1
    return max(count, 1)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # respects cpusets (containers, taskset)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def torch_threads(node_config: Mapping[str, Any]) -> int | None:
    """The thread count this node's ClientApp should use, None to keep torch's default.

    ``torch-threads`` from the node config wins (in simulation too); otherwise a deployed node
    that shares its host with other SuperNodes gets ``usable_cores() // supernodes`` (>= 1).
    """
    if THREADS_KEY in node_config:
        value = node_config[THREADS_KEY]
        try:
            threads = int(value)
        except (TypeError, ValueError):
            threads = 0
        if threads < 1 or str(value).strip() != str(threads):
            raise ValueError(
                f"node config {THREADS_KEY}={value!r} is not a positive integer: start the SuperNode "
                f'with --node-config "... {THREADS_KEY}=4" (or leave it out for the default)'
            )
        return threads
    if not is_deployed(node_config):
        return None
    nodes = supernodes_on_host()
    return max(1, usable_cores() // nodes) if nodes > 1 else None


def node_device(node_config: Mapping[str, Any], run_device: str) -> str:
    """The device this node trains on: node config ``device`` when set (checked: a torch device
    this machine has), else the run's ``device`` (``auto``: CUDA when present)."""
    value = node_config.get(DEVICE_KEY)
    if value is None or str(value).strip() in ("", "auto"):
        return run_device
    text = str(value).strip()
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(
            f"node config {DEVICE_KEY}={value!r} is not a torch device: use cpu, cuda or cuda:<index> "
            f"(e.g. --node-config \"... {DEVICE_KEY}='cuda:1'\"), or leave it out to follow the run's device"
        ) from None
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0 or (device.index is not None and device.index >= count):
            raise ValueError(
                f"node config {DEVICE_KEY}={text!r}, but this machine's torch sees {count} CUDA device(s): "
                f"pick one of {['cpu'] + [f'cuda:{i}' for i in range(count)]}"
            )
    return text


def apply_threads(node_config: Mapping[str, Any]) -> int:
    """Set torch's intra-op threads for this node (see :func:`torch_threads`); returns the count in use."""
    threads = torch_threads(node_config)
    if threads is not None and threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def deterministic_mode() -> None:
    """torch's deterministic kernels for the rest of this process (config ``deterministic=true``).

    On CPU pflower's numbers already depend only on the seed and the thread count; on CUDA,
    cuDNN's and cuBLAS's default kernels may sum in a different order from run to run (round-1
    loss 1.36420 on an H100 vs 1.36423 on CPU). This asks for the deterministic ones, at some
    speed; an op that has none raises, naming itself."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


def warm_up(model: torch.nn.Module, in_shape: tuple[int, ...], device: torch.device) -> float | None:
    """Once per process and CUDA device: a forward/backward pass of a throw-away copy of the model
    on two zero samples, so kernel loading and handle creation happen here, not in the timed
    evaluation. Returns the seconds it took, None when nothing was done (CPU, or already warm)."""
    if device.type != "cuda" or str(device) in _warm_devices:
        return None
    _warm_devices.add(str(device))
    t0 = time.perf_counter()
    probe = copy.deepcopy(model).to(device).train()
    out = probe(torch.zeros((2, *in_shape), device=device))
    out.float().sum().backward()
    torch.cuda.synchronize(device)
    del probe, out
    return time.perf_counter() - t0
