"""Client state: personal tensors survive rounds (context.state) and restarts (state-dir)."""

import numpy as np
import torch
from flwr.app import Context, RecordDict

from pflower.client_app.state import ClientState
from pflower.server_app.runner import build
from pflower.simulation.inprocess import InProcessGrid


def ctx(node_id=1):
    return Context(run_id=1, node_id=node_id, node_config={}, state=RecordDict(), run_config={})


def test_state_round_trip_in_context_and_directory(tmp_path):
    tensors = {"groups.classifier.weight": torch.randn(3, 4), "groups.conv1.1.running_mean": torch.randn(6)}
    c = ctx()
    ClientState(c, 2, "run-a", str(tmp_path)).save(tensors)
    same_process = ClientState(c, 2, "run-a", str(tmp_path)).load()
    restarted = ClientState(ctx(), 2, "run-a", str(tmp_path)).load()  # fresh context, same directory
    for loaded in (same_process, restarted):
        assert set(loaded) == set(tensors)
        assert all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    assert ClientState(ctx(), 2, "run-b", str(tmp_path)).load() == {}  # another run starts fresh
    assert ClientState(ctx(), 3, "run-a", str(tmp_path)).load() == {}


def test_restarted_supernode_keeps_its_personal_head(compose, tiny_overrides, tmp_path):
    cfg = compose(*tiny_overrides, "method=fedper", "fraction=1.0")
    strategy = build(cfg, run_token="restart")
    grid = InProcessGrid(4, node_config={"state-dir": str(tmp_path / "state")})
    strategy.start(grid, num_rounds=1)
    old_ctx = grid.contexts[grid.node_of_client[0]]
    head_before = ClientState(old_ctx, 0, "restart").load()["groups.classifier.weight"].numpy()
    grid.remove_node(grid.node_of_client[0])
    grid.add_node(0, node_id=9999, node_config={"state-dir": str(tmp_path / "state")})  # empty context
    loaded = ClientState(grid.contexts[9999], 0, "restart", str(tmp_path / "state")).load()
    np.testing.assert_array_equal(loaded["groups.classifier.weight"].numpy(), head_before)
    init = strategy.model.global_arrays["groups.classifier.weight"]
    assert not np.allclose(head_before, init)  # it is the trained head, not the initial one


def test_saves_are_kept_by_round_and_a_replayed_round_replaces_the_later_ones(tmp_path):
    c = ctx()
    state = ClientState(c, 0, "run", str(tmp_path), versions=3)
    for rnd in (1, 2, 4, 5):
        state.save({"w": torch.full((2,), float(rnd))}, rnd)
    saved = lambda before: state.load(before_round=before)["w"][0].item()  # noqa: E731
    assert (saved(None), saved(5), saved(4), saved(3)) == (5.0, 4.0, 2.0, 2.0)  # round 1 pruned (versions=3)
    state.save({"w": torch.full((2,), 40.0)}, 4)  # the server replays round 4: round 5's save is stale
    assert saved(None) == 40.0 and saved(6) == 40.0 and saved(4) == 2.0
    restarted = ClientState(ctx(), 0, "run", str(tmp_path), versions=3)  # from the file, same answers
    assert restarted.load(before_round=4)["w"][0].item() == 2.0 and restarted.load()["w"][0].item() == 40.0


def test_unversioned_state_file_of_an_older_pflower_is_read(tmp_path):
    path = tmp_path / "run" / "client_1.pt"
    path.parent.mkdir()
    torch.save({"w": torch.ones(2)}, path)
    assert torch.equal(ClientState(ctx(), 1, "run", str(tmp_path)).load(before_round=3)["w"], torch.ones(2))
