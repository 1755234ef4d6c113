"""A resume that cannot be exact is refused, naming the clients that lost their state and the fix;
forced, it goes on and the run says so in its metrics, summary and report row."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from flwr.app import Context, RecordDict
from grid_faults import Crash, CrashingGrid

from pflower.client_app.state import ClientState
from pflower.reports.report import report_rows, resume_notes, wall_text
from pflower.server_app.results import read_metrics
from pflower.server_app.runner import run_experiment
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.base.client_directory import ClientStateLost

BASE = ["method=fedper", "rounds=3", "fraction=1.0"]


def deployed_grid(n: int, state_dir: Path | None = None, cls=InProcessGrid, **kwargs) -> InProcessGrid:
    """Nodes as users start them (``client-id``, optionally ``state-dir``), not simulated ones."""
    grid = cls(0, **kwargs)
    for cid in range(n):
        grid.add_node(cid, 1000 + cid, {"client-id": cid, **({"state-dir": str(state_dir)} if state_dir else {})})
    return grid


def crashed(compose, overrides, grid) -> Path:
    cfg = compose(*overrides)
    before = set(Path(cfg.run.output_dir).glob("*/*"))
    with pytest.raises(Crash):
        run_experiment(grid, cfg)
    (run_dir,) = [p for p in set(Path(cfg.run.output_dir).glob("*/*")) - before if p.is_dir()]
    return run_dir


def test_memory_only_client_state_refuses_a_resume_in_a_new_process(compose, tiny_overrides):
    overrides = [*tiny_overrides, *BASE, "client_state_dir=null"]
    run_dir = crashed(compose, overrides, CrashingGrid(4, crash_at=3))
    with pytest.raises(ClientStateLost) as refused:
        run_experiment(InProcessGrid(4), compose(*overrides, f"resume={run_dir}"))
    text = str(refused.value)
    assert "client(s) 0, 1, 2, 3 trained before" in text and "client_state_dir: null" in text
    assert "resume_force=true" in text and "state-dir" in text
    assert [r["round"] for r in read_metrics(run_dir)] == [1, 2]  # nothing written, nothing lost


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_forced_resume_runs_and_is_marked_everywhere(compose, tiny_overrides):
    overrides = [*tiny_overrides, *BASE, "client_state_dir=null"]
    run_dir = crashed(compose, overrides, CrashingGrid(4, crash_at=3))
    summary = run_experiment(InProcessGrid(4), compose(*overrides, f"resume={run_dir}", "resume_force=true"))
    rounds = read_metrics(run_dir)
    assert [r["round"] for r in rounds] == [1, 2, 3] and rounds[2]["client_state_lost"] == [0, 1, 2, 3]
    assert summary["client_state_lost"] == {"3": [0, 1, 2, 3]} and summary["resumed_after_rounds"] == [2]
    (row,) = report_rows([run_dir])
    assert "resumed after 2" in row["method"] and "CLIENT STATE LOST at 3" in row["method"]


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_deployed_nodes_without_a_state_dir_refuse_with_one_that_resume_exactly(compose, tiny_overrides, tmp_path):
    """A deployed node never writes to the server's client_state_dir (a path on another machine):
    restarted without its own state-dir it has lost its state; with one, the resume is exact."""
    overrides = [*tiny_overrides, *BASE]
    run_dir = crashed(compose, overrides, deployed_grid(4, cls=CrashingGrid, crash_at=3))
    assert not (run_dir / "client_state").exists()
    with pytest.raises(ClientStateLost, match=r"client\(s\) 0, 1, 2, 3 trained before"):
        run_experiment(deployed_grid(4), compose(*overrides, f"resume={run_dir}"))

    full = run_experiment(deployed_grid(4, tmp_path / "full"), compose(*overrides))
    run_dir = crashed(compose, overrides, deployed_grid(4, tmp_path / "nodes", cls=CrashingGrid, crash_at=3))
    resumed = run_experiment(deployed_grid(4, tmp_path / "nodes"), compose(*overrides, f"resume={run_dir}"))
    for a, b in zip(read_metrics(full["run_dir"]), read_metrics(run_dir), strict=True):
        assert (a["test_before_acc"], a["train_loss"]) == (b["test_before_acc"], b["train_loss"])
    assert full["final_acc"] == resumed["final_acc"] and "client_state_lost" not in resumed


def test_a_client_that_keeps_no_tensor_still_shows_its_saved_round(tmp_path):
    state = ClientState(
        Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={}), 0, "run-a", str(tmp_path)
    )
    assert state.newest_round() == 0
    state.save({}, server_round=4)  # a model with no BN and no personal layer keeps nothing
    assert state.newest_round() == 4 and state.load() == {}
    fresh = ClientState(
        Context(run_id=1, node_id=2, node_config={}, state=RecordDict(), run_config={}), 0, "run-a", str(tmp_path)
    )
    assert fresh.newest_round() == 4  # from the file, as a new process finds it
    state.save({"w": torch.ones(2)}, server_round=5)
    assert state.newest_round() == 5 and set(state.load()) == {"w"}
    other_run = ClientState(
        Context(run_id=1, node_id=3, node_config={}, state=RecordDict(), run_config={}), 0, "run-b", str(tmp_path)
    )
    assert other_run.newest_round() == 0


def test_report_notes_and_wall_over_segments():
    assert resume_notes({}) == []
    assert resume_notes({"resumed_after_rounds": [5, 9]}) == ["resumed after 5, 9"]
    assert resume_notes({"resumed_after_rounds": [5], "client_state_lost": {"6": [1]}}) == [
        "resumed after 5",
        "CLIENT STATE LOST at 6",
    ]
    assert wall_text({"wall_time_s": 120.0}) == "2.0 min"
    # a summary written before summaries summed the segments holds the last one only
    assert wall_text({"wall_time_s": 120.0, "resumed_after_round": 5}) == ">= 2.0 min (last segment)"
    assert wall_text({"wall_time_s": 120.0, "resumed_after_round": 5, "resumed_after_rounds": [5]}) == "2.0 min"
