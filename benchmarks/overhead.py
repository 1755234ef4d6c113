"""Benchmark 1: pflower's wall time per round against the plain-PyTorch compute floor.

Workload (issue 5): FedAvg on Fashion-MNIST, 100 clients, 10 per round, 5 local epochs,
batch 32, LeNet-5 (the FedCMD paper set-up, ``experiment=fedcmd_fmnist``), R rounds.

* **pflower**: the run through pflower's simulation (``pflower sim``: Flower's simulation
  engine, one Ray actor per CPU, the real ClientApp and Strategy, checkpoints and
  metrics.jsonl written every round, ``test_before``/``test_after`` evaluated by every
  client).
* **floor**: the same SGD steps on the same tensors in one plain Python loop with no FL
  framework: the same clients per round (read from pflower's metrics.jsonl), the same
  shuffling seeds, the same weighted average. Once without evaluation (the pure compute
  floor) and once with the same two evaluations pflower does (the floor of the same work).
  The floor's final model is compared with pflower's checkpoint: equal up to float
  rounding means both did the same steps.

Ratios are per round (median over rounds 2..R; round 1 carries one-time data loading) and
for the whole command (Ray start-up and data loading included), each against a floor measured
in the same repeat. Run: ``python -m benchmarks.overhead`` (``--rounds``, ``--repeats``).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import statistics
import sys
import tempfile
import time
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from benchmarks.common import markdown_table, publish, run_header
from benchmarks.memory import ROLES, PeakMemory, gb

WORKLOAD = ["experiment=fedcmd_fmnist", "method=fedavg", "final_eval=false"]


def pflower_run(rounds: int, out: Path, extra: list[str]) -> dict[str, Any]:
    """One pflower simulation; returns wall time, per-round records and the final model."""
    from pflower.server_app.run_plan import plan_run
    from pflower.simulation.simulate import simulate
    from pflower.strategies.base.checkpoint import load_checkpoint

    plan = plan_run([*WORKLOAD, f"rounds={rounds}", f"output_dir={out}", *extra])
    t0 = time.perf_counter()
    summary = simulate(plan)
    wall = time.perf_counter() - t0
    run_dir = Path(summary["run_dir"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = load_checkpoint(run_dir).decode()["global_arrays"]
    return {"plan": plan, "wall": wall, "records": records, "final": final}


def floor_run(plan: Any, clients_per_round: list[list[int]], evaluate: bool, threads: int) -> dict[str, Any]:
    """The same FedAvg rounds as a plain loop: no messages, no processes, no files."""
    from pflower.federated_data import load_client_data
    from pflower.models import build_model

    torch.set_num_threads(threads)
    spec, seed, train = plan.data, plan.run.seed, plan.client_fields["train"]
    t_data = time.perf_counter()
    data = {cid: load_client_data(spec, cid) for r in clients_per_round for cid in r}
    t_data = time.perf_counter() - t_data
    (model_spec,) = plan.archs.values()
    model_kwargs = {k: v for k, v in model_spec.items() if k != "name"}
    global_model = build_model(model_spec["name"], spec.info.in_shape, spec.info.num_classes, seed=seed, **model_kwargs)
    global_state = {k: v.clone() for k, v in global_model.state_dict().items()}
    epochs, bs, lr = int(train["epochs"]), int(train["batch_size"]), float(train["lr"])
    round_times = []
    for rnd, clients in enumerate(clients_per_round, start=1):
        t0 = time.perf_counter()
        states, weights = [], []
        for cid in clients:
            d = data[cid]
            model = copy.deepcopy(global_model)
            model.load_state_dict(global_state)
            if evaluate:
                _accuracy(model, d.x_test, d.y_test)
            gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}-{cid}-{rnd}".encode()))
            torch.manual_seed(zlib.crc32(f"{seed}-{cid}-{rnd}".encode()))
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            model.train()
            n = len(d.y_train)
            for _ in range(epochs):
                order = torch.randperm(n, generator=gen)
                for start in range(0, n, bs):
                    idx = order[start : start + bs]
                    if len(idx) < 2:
                        continue
                    opt.zero_grad(set_to_none=True)
                    nn.functional.cross_entropy(model(d.x_train[idx]), d.y_train[idx]).backward()
                    opt.step()
            if evaluate:
                _accuracy(model, d.x_test, d.y_test)
            states.append(model.state_dict())
            weights.append(float(n))
        w = torch.tensor(weights, dtype=torch.float64) / sum(weights)
        global_state = {
            k: (sum(wi * s[k].double() for wi, s in zip(w, states))).to(global_state[k].dtype)
            if global_state[k].is_floating_point()
            else states[-1][k]
            for k in global_state
        }
        round_times.append(time.perf_counter() - t0)
    return {"round_times": round_times, "data_s": t_data, "final": {k: v.numpy() for k, v in global_state.items()}}


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    correct = sum(int((model(x[s : s + 256]).argmax(1) == y[s : s + 256]).sum()) for s in range(0, len(y), 256))
    model.train()
    return correct / max(len(y), 1)


def _max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    keys = [k for k in a if k in b and np.issubdtype(np.asarray(a[k]).dtype, np.floating)]
    return max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for k in keys)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--single-thread-floor",
        action="store_true",
        help="also time the floor with 1 torch thread (on 2 cores it was 1.1-1.75x slower than the default)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--out", default="benchmarks/results/overhead.md", help="where the table is written ('' = print only)"
    )
    parser.add_argument("--pflower-override", action="append", default=[], help="extra key=value for the pflower run")
    parser.add_argument(
        "--backends", default="ray,serial", help="pflower sim engines to run in each repeat (comma-separated)"
    )
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is excluded from the per-round median)")
    t_start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    per: dict[str, list[float]] = defaultdict(list)
    memory: dict[str, list[PeakMemory]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="pflower-bench-") as tmp:
        for rep, backend in itertools.product(range(args.repeats), backends):  # one row per repeat and engine
            with PeakMemory() as peak:  # the whole process tree: Ray's GCS, raylet and workers too
                run = pflower_run(
                    args.rounds, Path(tmp) / f"r{rep}-{backend}", [*args.pflower_override, f"backend={backend}"]
                )
            memory[backend].append(peak)
            recs = run["records"]
            clients = [r["clients"] for r in recs]
            default_threads = torch.get_num_threads()
            floor = floor_run(run["plan"], clients, evaluate=False, threads=default_threads)
            floor_eval = floor_run(run["plan"], clients, evaluate=True, threads=default_threads)
            floor_1 = floor_run(run["plan"], clients, evaluate=False, threads=1) if args.single_thread_floor else None
            torch.set_num_threads(default_threads)
            p_round = statistics.median(r["round_time_s"] for r in recs[1:])
            f_round = statistics.median(floor["round_times"][1:])
            f1_round = statistics.median(floor_1["round_times"][1:]) if floor_1 else float("inf")
            best_floor = min(f_round, f1_round)
            fe_round = statistics.median(floor_eval["round_times"][1:])
            train_s = sum(r.get("client_train_s", 0) for r in recs)
            eval_s = sum(r.get("client_eval_s", 0) for r in recs)
            diff = _max_diff(run["final"], floor["final"])
            per[f"pflower {backend}"].append(p_round)
            per[f"wall {backend}"].append(run["wall"])
            per["pflower"].append(p_round)
            per["floor"].append(best_floor)
            per["floor+eval"].append(fe_round)
            per["wall"].append(run["wall"] / (args.rounds * best_floor))
            per["evalshare"].append(eval_s / max(train_s + eval_s, 1e-9))
            per["diff"].append(diff)
            rows.append(
                {
                    "repeat": rep + 1,
                    "backend": backend,
                    "pflower s/round": f"{p_round:.3f}",
                    f"floor s/round ({default_threads} thr)": f"{f_round:.3f}",
                    "floor s/round (1 thr)": f"{f1_round:.3f}" if floor_1 else "not run",
                    "floor+eval s/round": f"{fe_round:.3f}",
                    "ratio vs floor": f"{p_round / best_floor:.2f}x",
                    "ratio vs floor+eval": f"{p_round / fe_round:.2f}x",
                    "pflower command wall": f"{run['wall']:.1f} s",
                    "outside rounds (start-up, discovery, shut-down)": (
                        f"{run['wall'] - sum(r['round_time_s'] for r in recs):.1f} s"
                    ),
                    "wall / (R x floor)": f"{run['wall'] / (args.rounds * best_floor):.2f}x",
                    "client eval share": f"{100 * eval_s / max(train_s + eval_s, 1e-9):.1f} %",
                    "max |model diff|": f"{diff:.1e}",
                    "peak tree PSS": gb(peak.peak_pss),
                    "peak tree RSS": gb(peak.peak_rss),
                }
            )
            print(markdown_table(rows[-1:], list(rows[-1])), flush=True)
    med = {k: statistics.median(v) for k, v in per.items() if v}
    summary = [
        {
            "": "median over repeats and backends",
            "pflower s/round": f"{med['pflower']:.3f}",
            "floor s/round": f"{med['floor']:.3f}",
            "floor+eval s/round": f"{med['floor+eval']:.3f}",
            "ratio vs floor": f"{statistics.median(p / f for p, f in zip(per['pflower'], per['floor'])):.2f}x",
            "ratio vs floor+eval": (
                f"{statistics.median(p / f for p, f in zip(per['pflower'], per['floor+eval'])):.2f}x"
            ),
            "wall / (R x floor)": f"{med['wall']:.2f}x",
            "client eval share": f"{100 * med['evalshare']:.1f} %",
        },
    ]
    summary += [
        {
            "": f"median, backend={b}",
            "pflower s/round": f"{statistics.median(per[f'pflower {b}']):.3f}",
            "pflower command wall": f"{statistics.median(per[f'wall {b}']):.1f} s",
            "peak tree PSS": gb(int(statistics.median(m.peak_pss for m in memory[b]))),
            "peak tree RSS": gb(int(statistics.median(m.peak_rss for m in memory[b]))),
        }
        for b in backends
    ]
    parts = [
        {
            "backend": b,
            **{f"{r} PSS": gb(int(statistics.median(m.at_peak.get(r, (0, 0))[1] for m in memory[b]))) for r in ROLES},
        }
        for b in backends
    ]
    text = "\n\n".join(
        [
            run_header("python -m benchmarks.overhead " + " ".join(sys.argv[1:] if argv is None else argv), t_start),
            f"Workload: {' '.join(WORKLOAD)} rounds={args.rounds}, {args.repeats} repeats. Floor = the plain loop with "
            "torch's default thread count (and with 1 thread if --single-thread-floor; the faster one counts), "
            "measured "
            "in "
            "the same repeat. Per-round numbers: median over rounds 2..R.",
            markdown_table(rows, list(rows[0])),
            markdown_table(summary, list(dict.fromkeys(k for row in summary for k in row))),
            "Peak memory of the whole process tree (this process and every descendant), sampled every 0.25 s from "
            "/proc during each pflower run; PSS splits shared pages between processes (what the tree occupies), RSS "
            "counts them in every process. Where the PSS goes at its peak (medians over repeats):",
            markdown_table(parts, list(parts[0])),
            f"Total benchmark time: {time.perf_counter() - t_start:.0f} s.",
        ]
    )
    publish(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
