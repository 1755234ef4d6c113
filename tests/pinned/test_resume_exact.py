"""Resume loses nothing by default: every method, stopped after a round and resumed in a new
process (fresh client contexts, as a new `pflower sim` or a restarted simulation has), writes
exactly the numbers of the uninterrupted run, which ``pinned_numbers.json`` holds (the pinned
test proves those are what an uninterrupted run writes today)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from grid_faults import Crash, CrashingGrid

from pflower.server_app.results import read_metrics
from pflower.server_app.run_plan import plan_run
from pflower.server_app.runner import run_experiment
from pflower.simulation.inprocess import InProcessGrid
from pinned.cases import CASES, fingerprint, first_difference, load_pinned, overrides

PINNED = load_pinned()
RESUME_KEYS = ("resumed_after_round", "resumed_after_rounds")


def crash_then_resume(case: str, out: Path, crash_at: int) -> tuple[Path, dict]:
    plan = plan_run([*overrides(case), f"output_dir={out}"])
    n = plan.run.num_clients
    with pytest.raises(Crash):
        run_experiment(CrashingGrid(n, record=False, client_threads=1, crash_at=crash_at), plan)
    (run_dir,) = [p for p in out.glob("*/*") if p.is_dir()]
    resumed = plan_run([*overrides(case), f"output_dir={out}", f"resume={run_dir}"])
    # a new grid: every client context is empty, as in a new simulation process
    return run_dir, run_experiment(InProcessGrid(n, record=False, client_threads=1), resumed)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_resume_after_round_two_equals_the_uninterrupted_run(case, tmp_path):
    run_dir, summary = crash_then_resume(case, tmp_path / "out", crash_at=3)
    assert summary["resumed_after_rounds"] == [2]
    got = fingerprint(read_metrics(run_dir), {k: v for k, v in summary.items() if k not in RESUME_KEYS})
    diff = first_difference(PINNED[case], json.loads(json.dumps(got)))
    assert diff is None, f"{case}: the resumed run differs from the uninterrupted one at {diff}"
