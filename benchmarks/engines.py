"""``python -m benchmarks.engines``: pflower's simulation engines side by side (and FL-bench, the
peer library, when its checkout is given), on one workload, alternated, whole process trees.

Each run is one command (``pflower sim ... backend=X``, or FL-bench's ``main.py``) started from
here; its wall time is the command's, its memory the peak of the summed PSS (and RSS) of the
command's whole process tree (``benchmarks.memory``). Runs alternate (A B C D, D C B A, ...) so
a slow minute of the machine does not land on one engine. The workload is FedAvg on FMNIST with
LeNet-5, 100 clients, 10 a round, Dir(0.1), 5 local epochs, 50 rounds: the same set-up in both
libraries (FL-bench's recipe: docs/benchmarks.md, section 5).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

from benchmarks import gpu
from benchmarks.common import markdown_table, publish, run_header
from benchmarks.memory import PeakMemory

ROUNDS = 50
WORKLOAD = ["experiment=fedcmd_fmnist", "method=fedavg", "final_eval=false", "progress=false"]
# FL-bench's same workload (its main.py, from its checkout's root; the partition made by its
# generate_data.py as benchmarks/README.md says)
FLBENCH_ARGS = [
    "method=fedavg",
    "dataset.name=fmnist",
    "model.name=lenet5",
    "optimizer.name=sgd",
    "optimizer.lr=0.01",
    "optimizer.momentum=0",
    "optimizer.weight_decay=0",
    "common.seed=42",
    "common.join_ratio=0.1",
    "common.local_epoch=5",
    "common.batch_size=32",
    "common.use_cuda=false",
    "common.test.client.interval=100",
    "common.test.client.test=true",
    "mode=serial",
    "common.monitor=null",
]
GIB = 1024**3


def pflower_command(engine: str, rounds: int, out: Path, extra: list[str]) -> list[str]:
    pflower = shutil.which("pflower") or str(Path(sys.executable).parent / "pflower")
    engine_keys = engine.split(":")  # parallel:2 = backend=parallel workers=2
    keys = [f"backend={engine_keys[0]}"] + ([f"workers={engine_keys[1]}"] if len(engine_keys) > 1 else [])
    return [pflower, "sim", *WORKLOAD, f"rounds={rounds}", *keys, f"output_dir={out}", *extra]


def pflower_numbers(out: Path) -> dict[str, Any]:
    (summary_file,) = out.glob("*/*/summary.json")
    summary = json.loads(summary_file.read_text())
    rounds = [json.loads(line) for line in (summary_file.parent / "metrics.jsonl").read_text().splitlines()]
    return {
        "s_per_round": median(r["round_time_s"] for r in rounds),
        "headline": summary.get("headline_test_before_acc"),
    }


def run_one(engine: str, rounds: int, flbench: Path | None, flbench_python: str, extra: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pflower-engines-") as tmp:
        out = Path(tmp)
        if engine == "fl-bench":
            assert flbench is not None
            cmd = [flbench_python, "main.py", *FLBENCH_ARGS, f"common.global_epoch={rounds}"]
            cwd: Path | None = flbench
        else:
            cmd, cwd = pflower_command(engine, rounds, out, extra), None
        t0 = time.perf_counter()
        log = out / "log.txt"
        with log.open("wb") as sink:
            proc = subprocess.Popen(cmd, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT)
            with PeakMemory(root=proc.pid, interval=0.5) as peak, gpu.GpuPeak() as on_gpu:
                proc.wait()
        wall = time.perf_counter() - t0
        if proc.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
        row = {"engine": engine, "wall_s": wall, "pss_gib": peak.peak_pss / GIB, "rss_gib": peak.peak_rss / GIB}
        if on_gpu.utilisation:  # an NVIDIA GPU here: what the run held of it
            row.update(
                {
                    "gpu_peak_mib": on_gpu.peak_used_mib,
                    "gpu_processes": on_gpu.peak_processes,
                    "gpu_process_mib": on_gpu.peak_process_mib,
                    "gpu_util_pct": on_gpu.mean_utilisation,
                }
            )
        if engine != "fl-bench":
            row.update(pflower_numbers(out))
            started = re.search(r"parallel engine: \d+ worker processes \((\w+)\)", log.read_text(errors="replace"))
            if started:  # fork; forkserver when the clients compute on CUDA (or the ServerApp's process holds it)
                row["workers_start"] = started.group(1)
        return row


def summarize(rows: list[dict[str, Any]], reference: str) -> list[dict[str, Any]]:
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    ref = [r for r in rows if r["engine"] == reference]
    ref_wall = median(r["wall_s"] for r in ref) if ref else None
    ref_pss = median(r["pss_gib"] for r in ref) if ref else None
    table = []
    for engine in engines:
        mine = [r for r in rows if r["engine"] == engine]
        wall, pss = median(r["wall_s"] for r in mine), median(r["pss_gib"] for r in mine)
        walls = ", ".join(f"{r['wall_s']:.1f}" for r in mine)
        spr = [r["s_per_round"] for r in mine if "s_per_round" in r]
        table.append(
            {
                "engine": engine,
                "wall s (each run)": walls,
                f"wall / {reference}": f"{wall / ref_wall:.2f}" if ref_wall else "-",
                "s/round (median)": f"{median(spr):.2f}" if spr else "-",
                "peak tree PSS GiB": f"{pss:.2f}",
                f"PSS / {reference}": f"{pss / ref_pss:.2f}" if ref_pss else "-",
                "peak tree RSS GiB": f"{median(r['rss_gib'] for r in mine):.2f}",
                "headline acc": ", ".join(f"{r['headline']:.4f}" for r in mine if r.get("headline") is not None) or "-",
            }
        )
        on_gpu = [r for r in mine if "gpu_peak_mib" in r]
        if on_gpu:
            table[-1].update(
                {
                    "GPU peak MiB": f"{median(r['gpu_peak_mib'] for r in on_gpu):.0f}",
                    "CUDA processes": f"{max(r['gpu_processes'] for r in on_gpu)}",
                    "MiB per process (max)": f"{median(r['gpu_process_mib'] for r in on_gpu):.0f}",
                    "GPU util % (mean)": f"{median(r['gpu_util_pct'] for r in on_gpu):.0f}",
                }
            )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--engines",
        default="parallel,serial,ray",
        help="comma list: parallel[:N], batched[:threads], serial, ray, fl-bench",
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--flbench", type=Path, help="FL-bench checkout with the FMNIST partition made (adds fl-bench)")
    parser.add_argument("--flbench-python", default=sys.executable, help="the Python of FL-bench's environment")
    parser.add_argument("--out", default="benchmarks/results/engines.md", help="'' = print only")
    parser.add_argument("overrides", nargs="*", help="extra pflower sim key=value for every pflower run")
    args = parser.parse_args(argv)
    t_start = time.perf_counter()
    engines = [e for e in args.engines.split(",") if e]
    if args.flbench and "fl-bench" not in engines:
        engines.append("fl-bench")
    if "fl-bench" in engines and not (args.flbench and (args.flbench / "main.py").exists()):
        raise SystemExit("fl-bench: give --flbench <checkout> (with main.py and data/fmnist/partition.pkl)")
    rows = []
    for rep in range(args.repeats):
        for engine in engines if rep % 2 == 0 else engines[::-1]:
            row = run_one(engine, args.rounds, args.flbench, args.flbench_python, args.overrides)
            rows.append({"run": len(rows) + 1, **row})
            print(json.dumps(rows[-1]), flush=True)
    reference = "fl-bench" if "fl-bench" in engines else engines[-1]
    detail = [{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    summary = summarize(rows, reference)
    described = (
        "FedAvg, FMNIST, LeNet-5, 100 clients, 10 a round, Dir(0.1), 5 local epochs"
        if not args.overrides
        else "FedAvg, FMNIST, LeNet-5, 5 local epochs, with the overrides shown"
    )
    text = "\n\n".join(
        [
            run_header("python -m benchmarks.engines " + " ".join(sys.argv[1:] if argv is None else argv), t_start),
            f"Workload: `pflower sim {' '.join([*WORKLOAD, f'rounds={args.rounds}', *args.overrides])}` ({described})"
            f"{'; FL-bench: the same set-up by its main.py' if args.flbench else ''}. "
            "Each run is a whole command; wall is the command's, memory the peak over the run of the summed PSS/RSS of "
            f"its whole process tree (sampled every 0.5 s). Runs alternated; medians of {args.repeats}. "
            f"Cores usable: {len(os.sched_getaffinity(0))}.",
            markdown_table(summary, list(dict.fromkeys(k for row in summary for k in row))),
            "Every run:",
            markdown_table(detail, list(dict.fromkeys(k for row in detail for k in row))),
            f"Total benchmark time: {time.perf_counter() - t_start:.0f} s.",
        ]
    )
    publish(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
