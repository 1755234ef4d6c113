"""`pflower report RUN_DIR...`: a Markdown comparison table of finished runs, with the
paper's number beside ours where conf/paper_results/ has one."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from .config import conf_dir

COLUMNS = ("method", "dataset", "alpha", "rounds", "ours", "paper", "diff", "last-20", "final (all clients)", "MiB/round", "wall")


def find_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Run directories (holding summary.json) at or below each path, sorted."""
    runs: set[Path] = set()
    for p in map(Path, paths):
        if (p / "summary.json").exists():
            runs.add(p)
        else:
            runs.update(s.parent for s in p.rglob("summary.json"))
    if not runs:
        raise FileNotFoundError(f"no run directory (with summary.json) under {[str(p) for p in paths]}")
    return sorted(runs)


def paper_numbers() -> dict[tuple[str, str, float], tuple[float, str]]:
    """(method, dataset, alpha) -> (accuracy %, source) from conf/paper_results/*.yaml."""
    out: dict[tuple[str, str, float], tuple[float, str]] = {}
    for path in sorted((conf_dir() / "paper_results").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        source = data.pop("source", path.stem)
        for dataset, by_alpha in data.items():
            for alpha, methods in by_alpha.items():
                for method, value in methods.items():
                    out.setdefault((method, dataset, float(alpha)), (float(value), source))
    return out


def report_rows(runs: Sequence[Path]) -> list[dict[str, Any]]:
    papers = paper_numbers()
    rows = []
    for run in runs:
        s = json.loads((run / "summary.json").read_text())
        alpha = s.get("alpha")
        paper = papers.get((s["method"], s["dataset"], float(alpha))) if alpha is not None else None
        ours = 100 * s["headline_test_before_acc"]
        mib = (s["total_mib_down"] + s["total_mib_up"]) / max(s["rounds"], 1)
        rows.append(
            {
                "method": s["method"] + (f" (l*={s['personal_layer']})" if s.get("personal_layer") else ""),
                "dataset": s["dataset"],
                "alpha": alpha,
                "rounds": s["rounds"],
                "ours": f"{ours:.2f}",
                "paper": f"{paper[0]:.2f}" if paper else "",
                "diff": f"{ours - paper[0]:+.2f}" if paper else "",
                "last-20": f"{100 * s['last20_test_before_acc']:.2f}",
                "final (all clients)": f"{100 * s['final_acc']:.2f}" if s.get("final_acc") is not None else "",
                "MiB/round": f"{mib:.2f}",
                "wall": f"{s['wall_time_s'] / 60:.1f} min",
            }
        )
    return rows


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: pflower report RUN_DIR_OR_PARENT...")
        return 2
    print(markdown(report_rows(find_runs(argv))))
    return 0
