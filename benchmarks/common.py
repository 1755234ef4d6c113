"""What every benchmark shares: Markdown tables, a provenance header, the result file."""

from __future__ import annotations

import datetime as dt
import statistics
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def commit() -> str:
    """Short commit of the code measured, marked when the tree has uncommitted changes. A copy
    without its git history (a machine the tree was copied to) names it in ``PFLOWER_COMMIT``."""
    import os

    if os.environ.get("PFLOWER_COMMIT"):
        return f"{os.environ['PFLOWER_COMMIT']} (as given by PFLOWER_COMMIT)"
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" + uncommitted changes" if dirty else "")


def machine() -> str:
    import os
    import platform

    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.machine()}, {os.cpu_count()} CPU cores, {gpu}, torch {torch.__version__}"


def run_header(command: str, started: float | None = None) -> str:
    """Command, date, commit and machine: enough to know what a committed table came from."""
    now = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    return f"Command: `{command.strip()}`  \nDate: {now}  \nCommit: {commit()}  \nMachine: {machine()}"


def publish(text: str, out: str | Path | None) -> None:
    """Print a benchmark's report and, when ``out`` is given, write it there."""
    print("\n" + text)
    if out:
        write_result(out, text)


def write_result(path: str | Path, text: str) -> Path:
    out = Path(path)
    if not out.is_absolute():
        out = REPO / out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text.rstrip() + "\n")
    return out
