"""``optimizer_state=kept`` on every engine: the moments live in each client's role state, so a
run writes one set of numbers on the serial, parallel and batched engines, and across a resume
on another engine; and those numbers are not the fresh-optimizer run's (the state is used).
Felo (Adam over three architectures, as the authors' code keeps it) and FedRep with momentum
(two SGD stages a round, each with its own kept buffers)."""

from __future__ import annotations

import json

import pytest
from grid_faults import Crash, CrashingGrid

from pflower.server_app.results import read_metrics
from pflower.server_app.run_plan import plan_run
from pflower.server_app.runner import run_experiment
from pflower.simulation.batched import BatchedGrid
from pflower.simulation.inprocess import InProcessGrid
from pflower.simulation.parallel import ParallelGrid
from pinned.cases import fingerprint, first_difference, overrides, run_case

KEPT = {"felo": ("optimizer_state=kept",), "fedrep": ("momentum=0.9", "optimizer_state=kept")}


def parallel(n: int) -> ParallelGrid:
    return ParallelGrid(n, workers=2, client_threads=1)


def batched(n: int) -> BatchedGrid:
    return BatchedGrid(n, batch_clients=3, threads=1)


@pytest.mark.parametrize("case", list(KEPT))
@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_kept_state_moves_the_numbers_and_every_engine_writes_the_same(case):
    kept = run_case(case, extra=KEPT[case])
    fresh = run_case(case, extra=KEPT[case][:-1])
    assert first_difference(fresh, kept) is not None, "the kept moments changed nothing"
    # the parallel engine with the state in memory only: it reaches the next worker in the Context
    diff = first_difference(kept, run_case(case, parallel, extra=(*KEPT[case], "client_state_dir=null")))
    assert diff is None, f"{case}: parallel engine differs at {diff}"
    diff = first_difference(kept, run_case(case, batched, extra=KEPT[case]))  # one client at a time there
    assert diff is None, f"{case}: batched engine differs at {diff}"


class CrashingParallelGrid(CrashingGrid, ParallelGrid):
    """The parallel engine, killed when round ``crash_at``'s train messages are sent."""


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_a_resume_on_the_other_engine_equals_the_uninterrupted_kept_run(tmp_path):
    """Crash Felo after round 2 on the parallel engine, resume on the serial one."""
    expected = run_case("felo", extra=KEPT["felo"])
    out = tmp_path / "out"
    plan = plan_run([*overrides("felo"), *KEPT["felo"], f"output_dir={out}"])
    n = plan.run.num_clients
    crashing = CrashingParallelGrid(n, workers=2, client_threads=1, crash_at=3)
    with pytest.raises(Crash):
        run_experiment(crashing, plan)
    crashing.close()
    (run_dir,) = [p for p in out.glob("*/*") if p.is_dir()]
    second = InProcessGrid(n, record=False, client_threads=1)
    try:
        summary = run_experiment(
            second, plan_run([*overrides("felo"), *KEPT["felo"], f"output_dir={out}", f"resume={run_dir}"])
        )
    finally:
        second.close()
    got = fingerprint(read_metrics(run_dir), {k: v for k, v in summary.items() if not k.startswith("resumed_after")})
    diff = first_difference(expected, json.loads(json.dumps(got, sort_keys=True)))
    assert diff is None, f"crash on the parallel engine, resume on the serial one: differs at {diff}"
