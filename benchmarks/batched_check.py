"""``python -m benchmarks.batched_check``: does the batched engine land where the other engines do
after many rounds?

The batched engine's numbers equal the serial engine's to float rounding after one round
(tests/pinned/test_batched_engine.py); over many rounds those last bits grow as any two seeds'
differences do. So the check is statistical: run a method on the leaderboard's protocol with
``backend=batched`` for ``--rounds`` rounds and compare its headline at that round (the mean
``test_before`` of the last 10 rounds) with the same statistic of the committed leaderboard runs
of that method (3 seeds, written by the parallel engine), at the same round. It passes when the
batched run lies inside the seeds' range widened by one standard deviation on each side.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean, stdev

from benchmarks.common import markdown_table, publish, run_header

RUNS = Path("docs/results/leaderboard/runs")


def headline_at(metrics: Path, rounds: int, window: int = 10) -> float:
    """Mean ``test_before_acc`` of rounds ``rounds-window+1..rounds`` of one run's metrics.jsonl."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    picked = [r["test_before_acc"] for r in rows if rounds - window < int(r["round"]) <= rounds]
    if len(picked) != window:
        raise SystemExit(f"{metrics}: {len(picked)} of rounds {rounds - window + 1}..{rounds} recorded")
    return mean(picked)


def seeds_of(protocol: str, method: str) -> dict[str, Path]:
    return {
        seed.name: next(seed.glob("*/*/metrics.jsonl"))
        for seed in sorted((RUNS / protocol / method).glob("seed*"))
        if any(seed.glob("*/*/summary.json"))
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", default="fmnist_dir0.5")
    parser.add_argument("--methods", default="fedavg,fedper,fedcmd")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs", default="benchmarks/results/batched_check", help="where the batched runs go")
    parser.add_argument("--out", default="benchmarks/results/batched_check.md", help="'' = print only")
    parser.add_argument("overrides", nargs="*", help="extra pflower sim key=value (e.g. workers=1)")
    args = parser.parse_args(argv)
    t_start = time.perf_counter()
    rows = []
    for method in [m for m in args.methods.split(",") if m]:
        seeds = seeds_of(args.protocol, method)
        if len(seeds) < 2:
            raise SystemExit(f"{RUNS / args.protocol / method}: fewer than 2 finished seeds to compare with")
        out = Path(args.runs) / args.protocol / method
        done = list(out.glob("*/*/summary.json"))
        if not done:
            cmd = [sys.executable, "-m", "pflower.cli", "sim", f"experiment=protocol_{args.protocol}"]
            cmd += [f"method={method}", f"seed={args.seed}", f"rounds={args.rounds}", "backend=batched"]
            cmd += ["final_eval=false", "progress=false", f"output_dir={out}", *args.overrides]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            print(f"{method}: batched run {time.perf_counter() - t0:.0f} s", flush=True)
            done = list(out.glob("*/*/summary.json"))
        batched = headline_at(done[0].parent / "metrics.jsonl", args.rounds)
        values = {name: headline_at(path, args.rounds) for name, path in seeds.items()}
        low, high, spread = min(values.values()), max(values.values()), stdev(values.values())
        rows.append(
            {
                "method": method,
                f"batched, seed {args.seed}": f"{100 * batched:.2f}",
                "same seed, parallel engine": f"{100 * values.get(f'seed{args.seed}', float('nan')):.2f}",
                "committed seeds": ", ".join(f"{100 * v:.2f}" for v in values.values()),
                "seed std": f"{100 * spread:.2f}",
                "inside": "yes" if low - spread <= batched <= high + spread else "no",
            }
        )
    text = "\n\n".join(
        [
            run_header(
                "python -m benchmarks.batched_check " + " ".join(sys.argv[1:] if argv is None else argv), t_start
            ),
            f"Protocol `{args.protocol}`; the headline at round {args.rounds}: the mean test-before accuracy of rounds "
            f"{args.rounds - 9}-{args.rounds}, in %. The committed seeds are the leaderboard's runs (parallel engine, "
            f"{RUNS / args.protocol}); 'inside': the batched run lies within their range widened by one standard "
            "deviation on each side.",
            markdown_table(rows, list(rows[0])),
        ]
    )
    publish(text, args.out)
    return 0 if all(r["inside"] == "yes" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
