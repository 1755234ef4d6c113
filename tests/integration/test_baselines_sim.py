"""All baselines through the real `pflower sim` CLI: one hydra sweep, one run directory per method.

On the serial backend (every client in the CLI's process): the baselines' code is the same under
both engines, the Ray path is run by test_simulation.py (which also shows both engines write the
same numbers), and the sweep no longer starts Ray 14 times."""

from __future__ import annotations

import subprocess

import pytest
from test_simulation import BIN, SMALL, check_run_dir, run_dirs

pytestmark = pytest.mark.slow

METHODS = (
    "fedprox",
    "fedrep",
    "fedbabu",
    "fedbn",
    "lgfedavg",
    "pfedsim",
    "ditto",
    "fedamp",
    "cfl",
    "feddyn",
    "fedfomo",
    "fedap",
    "moon",
    "pfedla",
)
ALL = ["conv1", "conv2", "fc1", "fc2", "classifier"]


def test_pflower_sim_sweep_runs_every_baseline(tmp_path):
    out = tmp_path / "outputs"
    cmd = [
        str(BIN / "pflower"),
        "sim",
        "-m",
        f"method={','.join(METHODS)}",
        f"output_dir={out}",
        *SMALL,
        "backend=serial",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = run_dirs(out)
    assert set(runs) == {f"{m}-digits" for m in METHODS}, runs
    rounds = {m: check_run_dir(runs[f"{m}-digits"], 2) for m in METHODS}
    assert all(not r["dropped"] for m in METHODS for r in rounds[m])
    # whole models travel (FedBN: the groups do, their BN parameters do not; FedAMP: its cloud model u_i)
    for m in ("fedprox", "fedbn", "ditto", "cfl", "feddyn", "moon", "pfedla", "fedamp"):
        assert all(r["groups_down"] == r["groups_up"] == ALL for r in rounds[m])
    assert all(r["bytes_up"] < p["bytes_up"] for r, p in zip(rounds["fedbn"], rounds["fedprox"]))
    for m in ("fedrep", "fedbabu"):  # the classifier never travels
        assert all(r["groups_down"] == r["groups_up"] == ALL[:-1] for r in rounds[m])
    assert all(r["groups_down"] == r["groups_up"] == ["fc1", "fc2", "classifier"] for r in rounds["lgfedavg"])
    # pFedSim and FedAP, warm-up 0.5 of 2 rounds: round 1 FedAvg, round 2 personal
    assert [r["phase"] for r in rounds["pfedsim"]] == ["warmup", "personal"]
    assert [r["phase"] for r in rounds["fedap"]] == ["warmup", "personal"]
    assert rounds["fedap"][1]["bytes_up"] > rounds["fedap"][0]["bytes_up"]  # BN statistics go up once
    assert [r["num_clusters"] for r in rounds["cfl"]] == [1, 1]  # no split before start_round
    # FedFomo: round 1 has no stored models to download; round 2 downloads the round-1 models
    assert rounds["fedfomo"][0]["bytes_down"] == 0 < rounds["fedfomo"][1]["bytes_down"]
