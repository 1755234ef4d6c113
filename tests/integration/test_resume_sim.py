"""Checkpoint/resume through Flower's simulation engine (Ray): run, then resume with more rounds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pflower.server_app.results import read_metrics
from pflower.simulation.simulate import simulate
from pflower.strategies.base.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def test_simulated_run_resumes_with_more_rounds(compose, tiny_overrides, tmp_path):
    first = simulate(compose(*tiny_overrides, "method=fedper", "rounds=2", "backend=ray"))
    run_dir = Path(first["run_dir"])
    assert load_checkpoint(run_dir).round == 2
    # `pflower sim resume=<dir> rounds=3`: hydra's path, in a new process (a restarted server)
    cmd = [str(BIN / "pflower"), "sim", f"resume={run_dir}", "rounds=3"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [r["round"] for r in read_metrics(run_dir)] == [1, 2, 3]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_after_rounds"] == [2] and summary["final_clients"] == 4
    assert "resumed_after_round" not in summary and isinstance(summary["final_clients"], int)
    assert load_checkpoint(run_dir).round == 3
    assert not any(p.name.startswith(".checkpoint") for p in run_dir.iterdir())  # no temporary file left
