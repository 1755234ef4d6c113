"""FedCMD in a real Flower simulation (Ray): both phases, l* in the candidates, l* sent once."""

import json
from pathlib import Path

import pytest

from pflower.simulation.simulate import simulate

pytestmark = pytest.mark.slow


def test_fedcmd_simulation_goes_through_both_phases(compose, tmp_path):
    cfg = compose(
        "method=fedcmd",
        "method.kp=2",
        "dataset=digits",
        "num_clients=6",
        "rounds=4",
        "fraction=0.5",
        "local_epochs=1",
        "partition.min_size=20",
        "alpha=0.5",
    )
    summary = simulate(cfg)
    run_dir = Path(summary["run_dir"])
    rounds = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rounds] == [1, 1, 2, 2]
    candidates = ["fc1", "fc2", "classifier"]
    saved = json.loads((run_dir / "summary.json").read_text())
    layer = saved["personal_layer"]
    assert layer in candidates and saved["round_winners"] == [r["round_winner"] for r in rounds[:2]]
    assert all(r["round_winner"] in candidates for r in rounds[:2])
    assert all(sum(r[f"client_votes_{c}"] for c in candidates) == len(r["clients"]) for r in rounds[:2])
    assert all(r["personal_layer"] == layer for r in rounds[1:])
    all_groups = ["conv1", "conv2", "fc1", "fc2", "classifier"]
    assert all(r["groups_down"] == r["groups_up"] == all_groups for r in rounds[:2])
    # phase 2: everything goes up (φ is needed for Eq. 8); l* comes down only on first contact
    seen: set[int] = set()
    for r in rounds[2:]:
        assert r["groups_up"] == all_groups
        assert (layer in r["groups_down"]) == any(c not in seen for c in r["clients"])
        seen.update(r["clients"])
    assert 0.0 <= saved["headline_test_before_acc"] <= 1.0 and saved["final_clients"] == 6
