"""The baselines through the real `pflower sim` CLI: one hydra sweep, one run directory per method."""

from __future__ import annotations

import subprocess

import pytest
from test_simulation import BIN, SMALL, check_run_dir, run_dirs

pytestmark = pytest.mark.slow

METHODS = ("fedprox", "fedrep", "fedbabu", "fedbn", "lgfedavg", "pfedsim", "ditto")
ALL = ["conv1", "conv2", "fc1", "fc2", "classifier"]


def test_pflower_sim_sweep_runs_the_baselines(tmp_path):
    out = tmp_path / "outputs"
    cmd = [str(BIN / "pflower"), "sim", "-m", f"method={','.join(METHODS)}", f"output_dir={out}", *SMALL]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = run_dirs(out)
    assert set(runs) == {f"{m}-digits" for m in METHODS}, runs
    rounds = {m: check_run_dir(runs[f"{m}-digits"], 2) for m in METHODS}
    for m in ("fedprox", "fedbn", "ditto"):  # FedBN: the groups travel, their BN parameters do not
        assert all(r["groups_down"] == r["groups_up"] == ALL for r in rounds[m])
    assert all(r["bytes_up"] < p["bytes_up"] for r, p in zip(rounds["fedbn"], rounds["fedprox"]))
    for m in ("fedrep", "fedbabu"):  # the classifier never travels
        assert all(r["groups_down"] == r["groups_up"] == ALL[:-1] for r in rounds[m])
    assert all(r["groups_down"] == r["groups_up"] == ["fc1", "fc2", "classifier"] for r in rounds["lgfedavg"])
    # pFedSim, rho_general=0.5 of 2 rounds: round 1 FedAvg, round 2 personal (classifier up for S only)
    assert [r["phase"] for r in rounds["pfedsim"]] == ["warmup", "personal"]
