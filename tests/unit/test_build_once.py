"""A run's config is composed once, validated once, resolved once (RunPlan) and its model and
strategy built once, under `pflower sim` and under the ServerApp `flwr run` starts (issue 45).
Each step is counted by wrapping the function that does it."""

from __future__ import annotations

from collections import Counter

import pytest
from flwr.app import Context, RecordDict

import pflower.server_app.config as config
import pflower.server_app.run_plan as run_plan
import pflower.server_app.runner as runner
from pflower.simulation.inprocess import InProcessGrid


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counter:
    seen: Counter = Counter()

    def counted(module, name: str, label: str) -> None:
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            seen[label] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counted(config, "compose", "composition")  # hydra's compose, inside compose_config
    counted(config, "validate", "validation")
    counted(run_plan, "method_args", "resolution")  # once per RunPlan made from a config
    counted(runner, "build_model", "model build")
    counted(runner, "build_strategy", "strategy build")
    return seen


ONCE = {"composition": 1, "validation": 1, "resolution": 1, "model build": 1, "strategy build": 1}


def test_pflower_sim_composes_validates_resolves_and_builds_once(counts, tiny_overrides, tmp_path):
    from pflower.cli import main

    assert main(["sim", *tiny_overrides, "method=fedper", "backend=serial", f"output_dir={tmp_path}"]) == 0
    assert dict(counts) == ONCE


def test_a_sweep_plans_each_run_once(counts, tiny_overrides, tmp_path):
    """Each run of a sweep composed, validated and resolved once; its strategy built twice: once
    when the sweep is checked before its first run, once to run."""
    from pflower.cli import main

    argv = ["sim", "-m", "seed=1,2", *tiny_overrides, "method=fedper", "rounds=1", "backend=serial"]
    assert main([*argv, "progress=false", f"output_dir={tmp_path}"]) == 0
    assert dict(counts) == {"composition": 2, "validation": 2, "resolution": 2, "model build": 4, "strategy build": 4}
    assert len(list(tmp_path.glob("*/*/summary.json"))) == 2


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_the_serverapp_composes_validates_resolves_and_builds_once(counts, tmp_path):
    from pflower.server_app.app import main as server_app_main

    run_config = {"num_clients": 4, "dataset": "digits", "method": "fedper", "rounds": 1, "local_epochs": 1}
    run_config |= {"overrides": "partition.min_size=20 alpha=1.0", "output_dir": str(tmp_path), "progress": False}
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    server_app_main(InProcessGrid(4), context)
    assert dict(counts) == ONCE
