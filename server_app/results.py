"""A run's directory: resolved config, metrics.jsonl (one line per round), summary.json, curve PNG."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def make_run_dir(output_dir: str | Path, method: str, dataset: str, now: dt.datetime | None = None) -> Path:
    """``<output_dir>/<YYYY-MM-DD>/<HH-MM-SS>-<method>-<dataset>[-N]`` (never reuses a directory)."""
    now = now or dt.datetime.now()
    base = Path(output_dir).expanduser().resolve() / now.strftime("%Y-%m-%d")
    stem = f"{now.strftime('%H-%M-%S')}-{method}-{dataset}"
    base.mkdir(parents=True, exist_ok=True)
    for i in range(1000):
        path = base / (stem if i == 0 else f"{stem}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a fresh run directory under {base}")


class RunWriter:
    """Writes a run's files; each round is appended and fsynced before the next round starts."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.rounds: list[dict[str, Any]] = []

    def write_config(self, record: str) -> None:
        """The run's composed config (``RunPlan.record``) as its config.yaml."""
        (self.run_dir / "config.yaml").write_text(record)

    def append_round(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(jsonable(record), sort_keys=True)
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.rounds.append(dict(record))

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        atomic_write(self.run_dir / "summary.json", json.dumps(jsonable(summary), indent=2, sort_keys=True))

    def plot(self, title: str) -> Path:
        return plot_accuracy(self.rounds, self.run_dir / "accuracy.png", title)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_accuracy(rounds: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """Personalized accuracy (test_before) and after-training accuracy per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("test_before_acc", "test_before (headline)"), ("test_after_acc", "test_after")):
        pts = [(r["round"], 100 * r[key]) for r in rounds if key in r]
        if pts:
            ax.plot(*zip(*pts), label=label)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no round 1.5 on a short run
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value
