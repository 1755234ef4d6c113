"""benchmarks/overhead.py's compute floor does the same SGD steps as pflower (checked against a
real run on the in-process Grid), and its evaluation variant does not change the training."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ is a folder of the checkout, not an installed package

from benchmarks.overhead import _max_diff, floor_run  # noqa: E402
from pflower.server_app.runner import run_experiment  # noqa: E402
from pflower.simulation.inprocess import InProcessGrid  # noqa: E402
from pflower.strategies.base.checkpoint import load_checkpoint  # noqa: E402


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_floor_repeats_pflowers_fedavg_rounds(compose, tiny_overrides):
    cfg = compose(*tiny_overrides, "method=fedavg", "final_eval=false", "rounds=2")
    summary = run_experiment(InProcessGrid(4), cfg)
    run_dir = Path(summary["run_dir"])
    clients = [json.loads(line)["clients"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    pflower_final = load_checkpoint(run_dir).decode()["global_arrays"]

    plain = floor_run(cfg, clients, evaluate=False, threads=1)
    with_eval = floor_run(cfg, clients, evaluate=True, threads=1)
    assert len(plain["round_times"]) == 2 and all(t > 0 for t in plain["round_times"])
    shared = set(pflower_final) & set(plain["final"])
    assert len(shared) >= 8  # every trained tensor is compared
    assert _max_diff(pflower_final, plain["final"]) < 1e-5  # the same steps, up to float rounding
    for key, value in plain["final"].items():  # evaluating (eval mode) leaves the training alone
        np.testing.assert_array_equal(value, with_eval["final"][key], err_msg=key)
