"""`pflower sim -m ... --jobs 2`: a sweep's runs two at a time write what the same sweep writes
run by run (each run is its own process and run directory). Two runs, both at once: the seeds'
side of a sweep is tested on the Ray cluster (test_ray_cluster.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from integration.test_simulation import without_timings

BIN = Path(sys.executable).parent
SWEEP = [
    "-m",
    "method=fedavg,fedper",
    "seed=2",
    "num_clients=4",
    "rounds=2",
    "local_epochs=1",
    "fraction=0.5",
    "partition.min_size=20",
    "alpha=1.0",
    "backend=serial",
    "progress=false",
]


def runs_by_setting(out: Path) -> dict[tuple[str, int], list[dict]]:
    found = {}
    for run in (p for p in out.glob("*/*") if p.is_dir()):
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        lines = [without_timings(json.loads(x)) for x in (run / "metrics.jsonl").read_text().splitlines()]
        found[(cfg["method"]["name"], int(cfg["seed"]))] = lines
    return found


@pytest.mark.slow
def test_a_sweep_two_at_a_time_equals_the_sweep_run_by_run(tmp_path):
    pflower = str(BIN / "pflower")
    one_by_one = subprocess.run(
        [pflower, "sim", *SWEEP, f"output_dir={tmp_path / 'serial'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert one_by_one.returncode == 0, one_by_one.stderr[-3000:]
    two = subprocess.run(
        [pflower, "sim", *SWEEP, "--jobs", "2", f"output_dir={tmp_path / 'jobs'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    assert "[run 2/2] ended with exit status 0" in two.stdout and "the sweep's 2 runs ended, 2 at a time" in two.stdout
    expected, got = runs_by_setting(tmp_path / "serial"), runs_by_setting(tmp_path / "jobs")
    assert set(expected) == {("fedavg", 2), ("fedper", 2)}
    assert got == expected
