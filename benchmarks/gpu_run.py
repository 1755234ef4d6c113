"""The GPU run, prepared (issue 62, item 4): one command that measures, on one GPU, what the
engines do with it, and writes one table.

Cases, each a whole ``pflower sim`` command (``benchmarks.engines.run_one``: wall time, seconds a
round, peak memory of the process tree, and on an NVIDIA GPU its peak memory, the processes
holding a CUDA context and the mean utilisation sampled from ``nvidia-smi``):

* **LeNet-5 on FMNIST** (the engines benchmark's workload: FedAvg, 100 clients, 10 a round,
  Dir(0.1), 5 local epochs): the serial, parallel and batched engines;
* **ResNet-18 on FMNIST** (the same clients, 1 local epoch): the serial, parallel and batched
  engines, where a GPU should pay;
* **a sweep of 3 seeds** of the LeNet-5 workload: one after the other (serial engine) and
  ``--together`` (the batched engine training the three runs' clients as one computation).

``device=cuda`` when torch sees a GPU, else ``device=cpu``. Rounds are few (``--rounds``, 10
for LeNet-5 and 3 for ResNet-18 by default) so the whole command fits the 8 minutes a lent GPU
machine leaves for it; ``--smoke`` runs every case on digits with 4 clients and 1 round (the CPU
check that the command works: tests/unit/test_benchmarks.py). Run:
``python -m benchmarks.gpu_run [--out benchmarks/results/gpu_run.md]``.
"""

from __future__ import annotations

import argparse
import json
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
from benchmarks.engines import WORKLOAD, run_one
from benchmarks.memory import PeakMemory

GIB = 1024**3
SMOKE = ["dataset=digits", "num_clients=4", "partition.min_size=5"]
RESNET = ["model=resnet18", "~model.fc_layers", "local_epochs=1"]  # the experiment sets LeNet-5's fc_layers


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def sweep(together: bool, rounds: int, extra: list[str]) -> dict[str, Any]:
    """The 3-seed sweep of the LeNet-5 workload as one command: ``--together`` (batched) or the
    runs one after the other (serial)."""
    pflower = shutil.which("pflower") or str(Path(sys.executable).parent / "pflower")
    mode = ["--together", "backend=batched"] if together else ["backend=serial"]
    with tempfile.TemporaryDirectory(prefix="pflower-gpu-sweep-") as tmp:
        cmd = [pflower, "sim", "-m", "seed=1,2,3", *mode, *WORKLOAD, f"rounds={rounds}", f"output_dir={tmp}", *extra]
        t0 = time.perf_counter()
        log = Path(tmp) / "log.txt"
        with log.open("wb") as sink:
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
            with PeakMemory(root=proc.pid, interval=0.5) as peak, gpu.GpuPeak() as on_gpu:
                proc.wait()
        wall = time.perf_counter() - t0
        if proc.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
        per_round = [
            json.loads(line)["round_time_s"]
            for metrics in Path(tmp).glob("*/*/metrics.jsonl")
            for line in metrics.read_text().splitlines()
        ]
        runs = len(list(Path(tmp).glob("*/*/summary.json")))
    row = {"wall_s": wall, "pss_gib": peak.peak_pss / GIB, "runs": runs, "s_per_round": median(per_round)}
    if on_gpu.utilisation:
        row.update(gpu_peak_mib=on_gpu.peak_used_mib, gpu_util_pct=on_gpu.mean_utilisation)
    return row


ENGINES = ("serial", "parallel", "batched")


def cases(
    smoke: bool, rounds: int, resnet_rounds: int, engines: tuple[str, ...] = ENGINES
) -> list[tuple[str, str, int, list[str]]]:
    """(workload, engine, rounds, extra overrides) of every engine run."""
    base, data = (SMOKE, "digits") if smoke else ([], "FMNIST")
    r_lenet, r_resnet = (1, 1) if smoke else (rounds, resnet_rounds)
    resnet = [*RESNET, *(["local_steps=2"] if smoke else [])]
    out = [(f"LeNet-5, {data}", engine, r_lenet, base) for engine in engines]
    out += [(f"ResNet-18, {data}", engine, r_resnet, [*base, *resnet]) for engine in engines]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds of the LeNet-5 runs and the sweep")
    parser.add_argument("--resnet-rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="digits, 4 clients, 1 round: does the command work")
    parser.add_argument("--only", default=",".join(ENGINES), help="the engines of the LeNet-5 and ResNet-18 cases")
    parser.add_argument("--out", default=None, help="write the Markdown here (default: print it)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    on = device()
    rows = []
    engines = tuple(e for e in args.only.split(",") if e)
    if not set(engines) <= set(ENGINES):
        parser.error(f"--only takes engines of {list(ENGINES)}, got {args.only!r}")
    for workload, engine, rounds, extra in cases(args.smoke, args.rounds, args.resnet_rounds, engines):
        r = run_one(engine, rounds, None, sys.executable, [f"device={on}", *extra])
        rows.append({"workload": workload, "engine": engine, "rounds": rounds, **r})
        print(json.dumps(rows[-1]), flush=True)
    sweep_rounds = 1 if args.smoke else args.rounds
    sweep_extra = [f"device={on}", *(SMOKE if args.smoke else [])]
    for together in (False, True):
        r = sweep(together, sweep_rounds, sweep_extra)
        label = "3 seeds, --together (batched)" if together else "3 seeds, one after the other (serial)"
        data = "digits" if args.smoke else "FMNIST"
        rows.append({"workload": f"LeNet-5, {data}, a sweep", "engine": label, "rounds": sweep_rounds, **r})
        print(json.dumps(rows[-1]), flush=True)
    table = [
        {
            "workload": r["workload"],
            "engine": r["engine"],
            "rounds": r["rounds"],
            "wall s": f"{r['wall_s']:.1f}",
            "s/round (median)": f"{r['s_per_round']:.2f}",
            "tree PSS GiB": f"{r['pss_gib']:.2f}",
            "GPU peak MiB": f"{r['gpu_peak_mib']:.0f}" if "gpu_peak_mib" in r else "-",
            "GPU util % (mean)": f"{r['gpu_util_pct']:.0f}" if "gpu_util_pct" in r else "-",
            "headline acc": f"{r['headline']:.4f}" if r.get("headline") is not None else "-",
        }
        for r in rows
    ]
    text = "\n\n".join(
        [
            run_header("python -m benchmarks.gpu_run " + " ".join(sys.argv[1:] if argv is None else argv), started),
            f"Device: {on}{' (no GPU: the GPU columns stay empty)' if on == 'cpu' else ''}."
            + (" Smoke run: digits, 4 clients, 1 round." if args.smoke else ""),
            markdown_table(table, list(table[0])),
            f"Total: {time.perf_counter() - started:.0f} s.",
        ]
    )
    publish(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
