"""GPU memory and utilisation over a run, sampled from ``nvidia-smi`` in a thread (the GPU columns
of ``benchmarks.engines``). Absent ``nvidia-smi`` (no NVIDIA GPU), :func:`available` is False and
the sampler records nothing.

What is kept: the device's peak used memory (every process on it, ours or not: run on an
otherwise idle GPU), the peak number of processes holding a CUDA context and the largest one's
memory (a worker's cost), and the mean utilisation over the samples (the share of time a kernel
ran, as the driver reports it: a launch-bound workload reads low however busy its CPU side is).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from dataclasses import dataclass, field

GPU_QUERY = ["nvidia-smi", "--query-gpu=memory.used,utilization.gpu", "--format=csv,noheader,nounits"]
APPS_QUERY = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def available() -> bool:
    return shutil.which("nvidia-smi") is not None


def parse_gpu(text: str) -> tuple[int, int]:
    """(memory used MiB, utilisation %) of the first GPU from ``GPU_QUERY``'s output."""
    first = text.strip().splitlines()[0]
    used, util = (int(float(part)) for part in first.split(","))
    return used, util


def parse_apps(text: str) -> dict[int, int]:
    """pid -> MiB for every process holding a CUDA context (``APPS_QUERY``'s output)."""
    apps = {}
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].replace(".", "", 1).isdigit():
            apps[int(parts[0])] = int(float(parts[1]))
    return apps


@dataclass
class GpuPeak:
    """Samples ``nvidia-smi`` every ``interval`` s while in its ``with`` block."""

    interval: float = 0.5
    peak_used_mib: int = 0
    peak_processes: int = 0
    peak_process_mib: int = 0
    utilisation: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def mean_utilisation(self) -> float | None:
        return sum(self.utilisation) / len(self.utilisation) if self.utilisation else None

    def sample(self) -> None:
        try:
            used, util = parse_gpu(subprocess.run(GPU_QUERY, capture_output=True, text=True, timeout=10).stdout)
            apps = parse_apps(subprocess.run(APPS_QUERY, capture_output=True, text=True, timeout=10).stdout)
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            return
        self.peak_used_mib = max(self.peak_used_mib, used)
        self.utilisation.append(util)
        self.peak_processes = max(self.peak_processes, len(apps))
        self.peak_process_mib = max([self.peak_process_mib, *apps.values()])

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> GpuPeak:
        if available():
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
