"""The join-ratio table of docs/results/fedcmd_fmnist.md comes from the committed runs by
``python -m benchmarks.join_ratio``: its columns on hand-made runs, and the page's block equal to
what the committed runs give now."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import join_ratio as jr

ROOT = Path(__file__).resolve().parents[2]


def _run(root: Path, name: str, method: str, fraction: float, curve: list[float], **summary) -> Path:
    d = root / "2026-01-01" / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(f"method:\n  name: {method}\nfraction: {fraction}\n")
    (d / "metrics.jsonl").write_text(
        "".join(json.dumps({"round": r, "test_before_acc": v / 100}) + "\n" for r, v in enumerate(curve, 1))
    )
    base = {
        "num_clients": 10,
        "rounds": len(curve),
        "headline_test_before_acc": 0.5,
        "last20_test_before_acc": 0.25,
        "final_acc": 0.875,
        "total_mib_up": 3.0,
        "total_mib_down": 1.5,
    }
    (d / "summary.json").write_text(json.dumps({**base, **summary}))
    (d / "provenance.json").write_text(json.dumps({"git_commit": "abcdef0123456789"}))
    return d


def test_windows_are_the_lowest_and_highest_10_round_means():
    curve = [0.0] * 10 + [10.0] * 10 + [30.0]  # windows ending in rounds 19, 20, 21: means 9, 10, 12
    assert jr.window_range(curve, 19, 21) == (9.0, 12.0)
    with pytest.raises(SystemExit, match="need rounds 12-22"):
        jr.window_range(curve, 21, 22)


def test_the_table_reads_each_column_from_the_run_files(tmp_path):
    a, b = tmp_path / "sweep_a", tmp_path / "sweep_b"
    _run(a, "10-00-00-fedper-fmnist", "fedper", 0.1, [50.0] * 12)
    _run(a, "10-05-00-fedavg-fmnist", "fedavg", 0.1, [10.0] * 12)  # not asked for: left out
    # windows ending in rounds 11 and 12: rounds 2-11 (one 40, nine 60) and 3-12 (ten 60): 58 and 60
    _run(b, "11-00-00-fedcmd-fmnist", "fedcmd", 0.2, [0.0, 40.0] + [60.0] * 10, personal_layer="fc1")
    text = jr.table([a, b], ("fedcmd", "fedper"), first=11, last=12).splitlines()
    assert text[0].startswith("| γ | method | run |") and "ending in rounds 11-12" in text[0]
    assert "all 10 clients" in text[0]
    assert text[2] == (
        "| 0.1 | fedper | `sweep_a/2026-01-01/10-00-00` | 50.00 | 25.00 | 50.00-50.00 | 87.50 | – "
        "| 0.25 / 0.12 | abcdef0 |"
    )
    assert text[3] == (
        "| 0.2 | fedcmd | `sweep_b/2026-01-01/11-00-00` | 50.00 | 25.00 | 58.00-60.00 | 87.50 | fc1 "
        "| 0.25 / 0.12 | abcdef0 |"
    )
    assert len(text) == 4


def test_two_runs_of_one_method_at_one_fraction_are_refused(tmp_path):
    _run(tmp_path / "x", "10-00-00-fedper-fmnist", "fedper", 0.1, [50.0] * 12)
    _run(tmp_path / "y", "10-00-00-fedper-fmnist", "fedper", 0.1, [50.0] * 12)
    with pytest.raises(SystemExit, match="two finished fedper runs at fraction 0.1"):
        jr.table([tmp_path / "x", tmp_path / "y"], ("fedper",), first=11, last=12)
    with pytest.raises(SystemExit, match="no such result folder"):
        jr.table([tmp_path / "z"], ("fedper",))


def test_the_page_is_what_the_committed_runs_give():
    page = (ROOT / "docs" / "results" / "fedcmd_fmnist.md").read_text()
    block = re.search(r"<!-- join-ratio:fedcmd -->\n(.*?)<!-- /join-ratio:fedcmd -->", page, re.S)
    assert block, "docs/results/fedcmd_fmnist.md lost its join-ratio block"
    assert block.group(1) == jr.table([ROOT / r for r in jr.DEFAULT_ROOTS], ("fedcmd", "fedper")), (
        "the join-ratio table drifted from the runs: python -m benchmarks.join_ratio --section fedcmd"
    )
