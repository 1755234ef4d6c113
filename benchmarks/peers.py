"""A peer library's implementation of a method beside pflower's, on the same clients, from
committed run files only.

    python -m benchmarks.peers docs/results/peers_flbench --section flbench

Reads, for every method directory ``<dir>/<method>/``, FL-bench's ``flbench/metrics.csv`` (its
``accuracy_test_before`` per round, in percent, the sampled clients' mean) with ``flbench/timing.txt``
(the wall time and the arguments of the run, written by the recipe's script) and pflower's
``pflower/**/metrics.jsonl`` (its ``test_before_acc`` per round, with ``summary.json`` and
``config.yaml``), takes the same statistic from both (the mean ``test_before`` accuracy of the last
``--last`` rounds), and writes the table between ``<!-- peers:NAME -->`` and ``<!-- /peers:NAME -->``
of docs/peers.md. The declared rule: the two are *within* when they differ by at most ``--tolerance``
points (2), else the page says where they differ, by reading both codes (the per-method notes
beside the table, written by hand and naming lines on both sides).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from benchmarks.authors.side_by_side import last_mean, pflower_curve, write_section

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "peers.md"


@dataclass(frozen=True)
class Pair:
    """One method's two runs: each side's test_before curve (percent), wall time and what ran."""

    method: str
    peer: list[float]
    ours: list[float]
    peer_wall_s: float | None
    ours_wall_s: float | None
    peer_args: str
    ours_options: str


def peer_curve(path: Path) -> list[float]:
    """FL-bench's ``accuracy_test_before`` per round (its ``metrics.csv``), in percent."""
    with path.open() as f:
        rows = sorted(csv.DictReader(f), key=lambda r: int(r["epoch"]))
    return [float(r["accuracy_test_before"]) for r in rows]


def timing(path: Path) -> tuple[float | None, str]:
    """(wall seconds, the run's arguments) from the recipe script's ``timing.txt``."""
    if not path.exists():
        return None, ""
    fields = dict(line.split(" ", 1) for line in path.read_text().splitlines() if " " in line)
    wall = fields.get("wall_s")
    return (float(wall) if wall else None), fields.get("args:", "").strip()


def collect(root: Path) -> list[Pair]:
    """Every method directory of ``root`` holding both runs (the others are listed as missing): one
    pair per pflower run, so that a method run at its default reading and at the peer's sits on
    two rows (its options say which)."""
    pairs = []
    for method_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        peer = method_dir / "flbench" / "metrics.csv"
        if not peer.exists():
            continue
        wall, args = timing(method_dir / "flbench" / "timing.txt")
        for ours in sorted(method_dir.glob("pflower/**/metrics.jsonl")):
            summary = json.loads((ours.parent / "summary.json").read_text())
            config = yaml.safe_load((ours.parent / "config.yaml").read_text())
            options = ", ".join(f"{k}={v}" for k, v in (config.get("method") or {}).items() if k != "name")
            pairs.append(
                Pair(
                    method_dir.name,
                    peer_curve(peer),
                    pflower_curve(ours),
                    wall,
                    summary.get("wall_time_s"),
                    args,
                    options,
                )
            )
    return pairs


def table(pairs: list[Pair], last: int, tolerance: float, missing: list[str]) -> str:
    head = (
        f"Metric: the mean test_before accuracy (%) of the sampled clients over the last {last} rounds, from "
        f"each side's own per-round file; *within* when the two differ by at most {tolerance:g} points.\n\n"
        "| method | rounds | FL-bench | pflower | pflower - FL-bench | within | FL-bench wall (s) "
        "| pflower wall (s) |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for p in pairs:
        a, b = last_mean(p.peer, last), last_mean(p.ours, last)
        wall = [f"{w:.0f}" if w is not None else "-" for w in (p.peer_wall_s, p.ours_wall_s)]
        rounds = f"{len(p.peer)} / {len(p.ours)}"
        within = "yes" if abs(b - a) <= tolerance else "no"
        rows.append(
            f"| `{p.method}` | {rounds} | {a:.2f} | {b:.2f} | {b - a:+.2f} | {within} | {wall[0]} | {wall[1]} |"
        )
    options = [
        f"- `{p.method}`: FL-bench `{p.peer_args or '(the recipe)'}`; pflower `{p.ours_options or '(defaults)'}`"
        for p in pairs
    ]
    tail = "\n\nWhat each side ran, besides the shared set-up:\n\n" + "\n".join(options) if options else ""
    if missing:
        tail += "\n\nNot run yet: " + ", ".join(f"`{m}`" for m in missing) + "."
    return head + "\n".join(rows) + tail + "\n"


def render(argv: list[str] | None = None) -> tuple[str, str | None]:
    """(the table with the line naming the command that made it, the page section to replace)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="docs/results/peers_<peer>: one directory per method")
    parser.add_argument("--last", type=int, default=10)
    parser.add_argument("--tolerance", type=float, default=2.0)
    parser.add_argument("--section", help="replace the <!-- peers:NAME --> block of docs/peers.md")
    parser.add_argument("--expect", nargs="*", default=[], help="methods the page should show (the rest: not run)")
    args = parser.parse_args(argv)
    pairs = collect(args.root)
    missing = [m for m in args.expect if m not in {p.method for p in pairs}]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    root = args.root.resolve()
    shown = root.relative_to(ROOT) if root.is_relative_to(ROOT) else args.root
    flags = (f" --section {args.section}" if args.section else "") + (
        f" --expect {' '.join(args.expect)}" if args.expect else ""
    )
    text = table(pairs, args.last, args.tolerance, missing)
    text += f"\nGenerated by `python -m benchmarks.peers {shown}{flags}` at {commit.stdout.strip()}.\n"
    return text, args.section


def main(argv: list[str] | None = None) -> None:
    text, section = render(argv)
    if section:
        write_section(PAGE, section, text, marker="peers")
        print(f"wrote the {section} block of {PAGE}")
    else:
        print(text)


if __name__ == "__main__":
    main()
