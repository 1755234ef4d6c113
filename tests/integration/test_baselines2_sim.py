"""FedAMP, CFL, FedDyn, FedFomo, FedAP, MOON, pFedLA through the real `pflower sim` CLI: one hydra sweep."""

from __future__ import annotations

import subprocess

import pytest
from test_simulation import BIN, SMALL, check_run_dir, run_dirs

pytestmark = pytest.mark.slow

METHODS = ("fedamp", "cfl", "feddyn", "fedfomo", "fedap", "moon", "pfedla")
ALL = ["conv1", "conv2", "fc1", "fc2", "classifier"]


def test_pflower_sim_sweep_runs_the_remaining_baselines(tmp_path):
    out = tmp_path / "outputs"
    cmd = [str(BIN / "pflower"), "sim", "-m", f"method={','.join(METHODS)}", f"output_dir={out}", *SMALL]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = run_dirs(out)
    assert set(runs) == {f"{m}-digits" for m in METHODS}, runs
    rounds = {m: check_run_dir(runs[f"{m}-digits"], 2) for m in METHODS}
    assert all(not r["dropped"] for m in METHODS for r in rounds[m])
    for m in ("cfl", "feddyn", "moon", "pfedla", "fedamp"):  # whole models travel (FedAMP: its cloud model u_i)
        assert all(r["groups_down"] == r["groups_up"] == ALL for r in rounds[m])
    assert [r["num_clusters"] for r in rounds["cfl"]] == [1, 1]  # no split before start_round
    # FedFomo: round 1 has no stored models to download; round 2 downloads the round-1 models
    assert rounds["fedfomo"][0]["bytes_down"] == 0 < rounds["fedfomo"][1]["bytes_down"]
    # FedAP, warmup_ratio 0.5 of 2 rounds: FedAvg then BN-similarity weights (statistics go up once)
    assert [r["phase"] for r in rounds["fedap"]] == ["warmup", "personal"]
    assert rounds["fedap"][1]["bytes_up"] > rounds["fedap"][0]["bytes_up"]
