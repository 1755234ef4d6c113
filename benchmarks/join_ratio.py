"""``python -m benchmarks.join_ratio``: the join-ratio table of docs/results/fedcmd_fmnist.md
(the FedCMD paper's Fig. 7: the share of clients sampled a round, γ), from committed run files only.

One row per (γ, method) for the methods asked for (``--methods``), one run each, found under the
result folders given (each run's ``config.yaml`` names its method and ``fraction``):

- last-10, last-20: ``summary.json``'s ``headline_test_before_acc`` and ``last20_test_before_acc``
  (the paper's statistic: the sampled clients' ``test_before``, averaged over the last rounds);
- windows: the lowest and highest 10-round mean of ``test_before`` (``metrics.jsonl``) over the
  windows ending in rounds ``--windows`` (160-200): how much the paper's statistic swings;
- final: ``final_acc`` (every client's own test split after the last round); l*: FedCMD's
  ``personal_layer``;
- MiB a round: ``total_mib_up`` and ``total_mib_down`` over the run's rounds;
- code: ``provenance.json``'s commit; a run older than provenance files names the commit that
  added its ``summary.json`` (``files: <commit>``).

With ``--section NAME`` the table replaces the page's ``<!-- join-ratio:NAME -->`` block
(tests/unit/test_join_ratio.py regenerates it and fails when the page drifts from the runs).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from benchmarks.authors.side_by_side import write_section
from pflower.server_app.results import read_metrics

ROOT = Path(__file__).resolve().parent.parent
# the α = 0.1 table's runs (γ = 0.1) and the sweep's folders (γ = 0.2-0.5)
DEFAULT_ROOTS = (
    "docs/results/fedcmd_fmnist_a0.1",
    *(f"docs/results/fedcmd_fmnist_a0.1_fraction0.{g}" for g in range(2, 6)),
)
COLUMNS = (
    "γ",
    "method",
    "run",
    "last-10 test_before",
    "last-20",
    "last-10 windows ending in rounds {first}-{last}",
    "final (all {clients} clients)",
    "l*",
    "MiB up / down a round",
    "code",
)


@dataclass(frozen=True)
class Run:
    fraction: float
    method: str
    path: Path  # the run directory
    summary: dict
    test_before: list[float]  # per round, in order


def find_runs(roots: list[Path], methods: tuple[str, ...]) -> list[Run]:
    """The finished runs of ``methods`` under ``roots``, sorted by (γ, method's place in ``methods``).
    Two finished runs of one method at one γ are refused: the table would have to choose."""
    found: dict[tuple[float, str], Run] = {}
    for root in roots:
        if not root.is_dir():
            raise SystemExit(f"{root}: no such result folder (run the sweep, or name the folders that hold it)")
        for summary_file in sorted(root.glob("*/*/summary.json")):
            config = yaml.safe_load((summary_file.parent / "config.yaml").read_text())
            method = config["method"]["name"]
            if method not in methods:
                continue
            key = (float(config["fraction"]), method)
            if key in found:
                raise SystemExit(
                    f"two finished {method} runs at fraction {key[0]}: {found[key].path} and {summary_file.parent}; "
                    "move one out of the folders given"
                )
            rows = [r for r in read_metrics(summary_file.parent) if "round" in r and "test_before_acc" in r]
            rows.sort(key=lambda r: r["round"])
            found[key] = Run(
                key[0],
                method,
                summary_file.parent,
                json.loads(summary_file.read_text()),
                [100.0 * r["test_before_acc"] for r in rows],
            )
    return [found[k] for k in sorted(found, key=lambda k: (k[0], methods.index(k[1])))]


def window_range(curve: list[float], first: int, last: int, width: int = 10) -> tuple[float, float]:
    """(lowest, highest) mean of ``width`` consecutive rounds over the windows ending in rounds
    ``first`` to ``last`` (1-based, inclusive)."""
    if last > len(curve) or first < width:
        raise SystemExit(f"windows ending in rounds {first}-{last} need rounds {first - width + 1}-{last}")
    means = [statistics.fmean(curve[end - width : end]) for end in range(first, last + 1)]
    return min(means), max(means)


def code_of(run_dir: Path) -> str:
    """The commit the run's code was at, or (a run older than provenance files) the commit that
    added its summary.json, as ``files: <commit>``."""
    provenance = run_dir / "provenance.json"
    if provenance.exists():
        commit = json.loads(provenance.read_text()).get("git_commit")
        if commit:
            return commit[:7]
    added = subprocess.run(
        ["git", "-C", str(ROOT), "log", "--diff-filter=A", "--format=%h", "--abbrev=7", "--"]
        + [str(run_dir / "summary.json")],
        capture_output=True,
        text=True,
    ).stdout.split()
    return f"files: {added[-1]}" if added else "unknown (not committed)"


def shown(run_dir: Path, roots_parent: Path) -> str:
    """``fedcmd_fmnist_a0.1/2026-11-21/10-56-59``: the run folder without its method-dataset suffix."""
    rel = run_dir.relative_to(roots_parent)
    return str(rel.parent / re.sub(r"^(\d\d-\d\d-\d\d).*$", r"\1", rel.name))


def table(roots: list[Path], methods: tuple[str, ...], first: int = 160, last: int = 200) -> str:
    runs = find_runs(roots, methods)
    if not runs:
        raise SystemExit(f"no finished run of {', '.join(methods)} under {', '.join(map(str, roots))}")
    clients = {int(r.summary["num_clients"]) for r in runs}
    head = [c.format(first=first, last=last, clients="/".join(map(str, sorted(clients)))) for c in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    parent = roots[0].resolve().parent
    for run in runs:
        s, low_high = run.summary, window_range(run.test_before, first, last)
        rounds = int(s["rounds"])
        cells = [
            f"{run.fraction:g}",
            run.method,
            f"`{shown(run.path.resolve(), parent)}`",
            f"{100 * s['headline_test_before_acc']:.2f}",
            f"{100 * s['last20_test_before_acc']:.2f}",
            f"{low_high[0]:.2f}-{low_high[1]:.2f}",
            f"{100 * s['final_acc']:.2f}",
            s.get("personal_layer") or "–",
            f"{s['total_mib_up'] / rounds:.2f} / {s['total_mib_down'] / rounds:.2f}",
            code_of(run.path),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="*", type=Path, default=[ROOT / r for r in DEFAULT_ROOTS])
    parser.add_argument("--methods", default="fedcmd,fedper", help="comma-separated, in the table's order")
    parser.add_argument("--windows", default="160-200", help="the rounds the 10-round windows end in")
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "results" / "fedcmd_fmnist.md")
    parser.add_argument("--section", help="also write the table into --page's block of this name")
    args = parser.parse_args(argv)
    first, last = (int(x) for x in args.windows.split("-"))
    text = table(list(args.roots), tuple(args.methods.split(",")), first, last)
    if args.section:
        write_section(args.page, args.section, text, marker="join-ratio")
    print(text, end="")


if __name__ == "__main__":
    main()
