"""Peak memory of a whole process tree (this process and every descendant: Ray's GCS, raylet and
workers under ``pflower sim``), sampled from /proc while a run goes on.

RSS counts a shared page once per process (so Ray's shared object store and torch's libraries
are counted many times); PSS splits each shared page between the processes that map it, so the
tree's PSS sum is what the tree really occupies. Linux only (``/proc/<pid>/smaps_rollup``).
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from pathlib import Path

ROLES = ("driver", "ray workers", "ray core", "other")


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids[ppid].append(int(stat.parent.name))
    return kids


def process_tree(root: int, kids: dict[int, list[int]] | None = None) -> list[int]:
    """``root`` and every descendant; ``kids``: a :func:`children_map` already read (one scan of
    /proc for many trees)."""
    kids, out, todo = children_map() if kids is None else kids, [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def rss_pss(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in bytes; (0, 0) for a process that is gone."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return rss, pss


def role(pid: int, root: int) -> str:
    if pid == root:
        return "driver"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "other"
    if "default_worker.py" in cmd or comm.startswith("ray::"):
        return "ray workers"
    if comm in ("gcs_server", "raylet") or "/ray/" in cmd:  # Ray's binaries and its Python services
        return "ray core"
    return "other"


def tree_memory(root: int) -> dict[str, tuple[int, int]]:
    """(RSS, PSS) summed per role over the tree under ``root``, and ``total``."""
    sums: dict[str, list[int]] = {r: [0, 0] for r in (*ROLES, "total")}
    for pid in process_tree(root):
        rss, pss = rss_pss(pid)
        for key in (role(pid, root), "total"):
            sums[key][0] += rss
            sums[key][1] += pss
    return {k: (v[0], v[1]) for k, v in sums.items()}


class PeakMemory:
    """Sample the tree every ``interval`` s in a thread; keep the peak total PSS, the peak total
    RSS, and the per-role breakdown at the PSS peak. Use as a context manager."""

    def __init__(self, root: int | None = None, interval: float = 0.25) -> None:
        self.root = root or os.getpid()
        self.interval = interval
        self.peak_pss = self.peak_rss = 0
        self.at_peak: dict[str, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        now = tree_memory(self.root)
        rss, pss = now["total"]
        self.peak_rss = max(self.peak_rss, rss)
        if pss >= self.peak_pss:
            self.peak_pss, self.at_peak = pss, now

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


WORKLOAD = ["experiment=fedcmd_fmnist", "method=fedavg", "final_eval=false", "rounds=15"]


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.memory``: peak memory of a whole ``pflower sim`` command (the CLI
    process and everything it starts) per backend, the FMNIST FedAvg workload by default."""
    import argparse
    import shutil
    import subprocess
    import sys
    import tempfile

    from benchmarks.common import markdown_table, publish, run_header

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--backends", default="serial,ray")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/memory_pflower_sim.md", help="'' = print only")
    parser.add_argument(
        "overrides", nargs="*", help="pflower sim key=value (default: the FMNIST FedAvg workload, 15 rounds)"
    )
    args = parser.parse_args(argv)
    t_start = time.perf_counter()
    overrides = args.overrides or WORKLOAD
    pflower = shutil.which("pflower") or str(Path(sys.executable).parent / "pflower")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pflower-mem-") as tmp:
        for rep in range(args.repeats):
            for backend in [b for b in args.backends.split(",") if b]:
                t0 = time.perf_counter()
                cmd = [pflower, "sim", *overrides, f"backend={backend}", f"output_dir={tmp}"]
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                with PeakMemory(root=proc.pid) as peak:
                    proc.wait()
                if proc.returncode:
                    raise SystemExit(f"{' '.join(cmd)} failed with exit status {proc.returncode}")
                rows.append(
                    {
                        "repeat": rep + 1,
                        "backend": backend,
                        "command wall": f"{time.perf_counter() - t0:.1f} s",
                        "peak tree PSS": gb(peak.peak_pss),
                        "peak tree RSS": gb(peak.peak_rss),
                        **{f"{r} PSS": gb(peak.at_peak.get(r, (0, 0))[1]) for r in ROLES if r != "other"},
                    }
                )
                print(markdown_table(rows[-1:], list(rows[-1])), flush=True)
    text = "\n\n".join(
        [
            run_header("python -m benchmarks.memory " + " ".join(sys.argv[1:] if argv is None else argv), t_start),
            f"Workload: `pflower sim {' '.join(overrides)}`. Peak over the run of the summed memory of the command's "
            "whole process tree (sampled every 0.25 s from /proc; PSS splits shared pages between the processes that "
            "map them, RSS counts them in each); the per-role columns are the PSS at that peak.",
            markdown_table(rows, list(rows[0])),
            f"Total benchmark time: {time.perf_counter() - t_start:.0f} s.",
        ]
    )
    publish(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
