"""FedMD: the consensus by hand, the shared subset draw, the transfer split of the data layer, the
client's transfer-digest-revisit order, and the strategy's messages."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from method_helpers import ctx, role_args_of
from test_strategy_base import make, run

from pflower.client_app.roles.fedmd import FEDMD, TRANSFERRED, FedMDRole, digest_loss, fedmd_subset
from pflower.client_app.training import TrainArgs
from pflower.federated_data import ClientData, DataSpec, load_public_data, load_transfer_data
from pflower.federated_data.client_data import _pool, client_indices
from pflower.models import build_model
from pflower.protocol.role_args import RoleArgsError
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.fedmd import consensus

MD = ["method=fedmd", "dataset.transfer_fraction=0.2", "method.subset=20", "method.transfer_epochs=1"]


def test_consensus_is_the_plain_mean_of_the_scores():
    a, b = np.array([[1.0, 3.0]], np.float32), np.array([[2.0, -1.0]], np.float32)
    np.testing.assert_array_equal(consensus([a, b]), [[1.5, 1.0]])
    with pytest.raises(ValueError):
        consensus([])


def test_every_party_draws_the_same_subset_from_seed_and_round():
    first = fedmd_subset(7, 3, 5, 100)
    assert first == fedmd_subset(7, 3, 5, 100) == sorted(set(first)) and len(first) == 5
    assert first != fedmd_subset(7, 4, 5, 100) and all(0 <= i < 100 for i in first)
    with pytest.raises(RoleArgsError, match="larger than the transfer split"):
        fedmd_subset(7, 3, 101, 100)


def test_the_transfer_split_is_in_no_partition_nor_the_holdout_and_normalizes_as_before():
    base = DataSpec(dataset="digits", num_clients=4, alpha=1.0, min_size=10, public="holdout", public_fraction=0.2)
    spec = DataSpec(**{**base.to_dict(), "options": base.options, "transfer_fraction": 0.1})
    pool, plain = _pool(spec), _pool(base)
    n = len(plain.labels)
    assert len(pool.transfer_labels) == int(n * 0.1) and len(pool.labels) == n - int(n * 0.1)
    np.testing.assert_array_equal(pool.mean, plain.mean)  # statistics of the same pool
    # the kept pool is exactly the complement of the transfer draw, in pool order: the partitions index it
    order = np.random.default_rng(spec.seed + 15_485_863).permutation(n)
    k = int(n * 0.1)
    np.testing.assert_array_equal(pool.labels, plain.labels[np.sort(order[k:])])
    np.testing.assert_array_equal(pool.transfer_images, plain.images[order[:k]])
    assert max(int(np.concatenate(client_indices(spec, c)).max()) for c in range(4)) < n - k
    tx, ty = load_transfer_data(spec)
    assert tx.shape[0] == len(ty) == k and ty.dtype == torch.int64
    assert load_public_data(spec)[0].shape == load_public_data(base)[0].shape  # the holdout is untouched
    with pytest.raises(ValueError, match="transfer_fraction"):
        load_transfer_data(base)


def test_digest_l1_loss_by_hand():
    model = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
    x, target = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 0.0], [4.0, 4.0]])
    # logits (1, 2) against consensus row 1 (4, 4): mean |.| = (3 + 2) / 2
    assert digest_loss(target, "l1")(model, x, torch.tensor([1])).item() == pytest.approx(2.5)


def test_the_role_transfers_once_digests_the_consensus_and_scores_this_rounds_subset():
    model = build_model("lenet5", (1, 28, 28), 3, seed=0)
    g = torch.Generator().manual_seed(0)
    tx, ty = torch.randn(30, 1, 28, 28, generator=g), torch.tensor([0, 1, 2] * 10)
    data = ClientData(0, tx[:12], ty[:12], tx[:4], ty[:4], 3)
    role = FedMDRole(role_args_of("fedmd", transfer_epochs=1, digest_epochs=1, subset=6, seed=9))
    c = ctx()
    c.transfer = (tx, ty)
    args = TrainArgs(lr=0.01, epochs=1, batch_size=4)
    first = role.fit(model, data, args, c)
    assert "transfer_loss" in first and "digest_loss" not in first and TRANSFERRED in c.extra_state
    assert c.upload_extra[FEDMD + "scores"].shape == (6, 3)
    c.received_extra = {FEDMD + "consensus": torch.zeros(6, 3), FEDMD + "round": torch.tensor([1])}
    c.upload_extra = {}
    second = role.fit(model, data, args, c)
    assert "transfer_loss" not in second and second["digest_loss"] >= 0
    c.transfer = None
    with pytest.raises(ValueError, match="transfer_fraction"):
        role.fit(model, data, args, c)


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_the_consensus_of_a_round_reaches_the_next_rounds_clients(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, *MD)
    grid = InProcessGrid(4)
    run(strategy, grid, rounds=2)
    by_round = {1: [], 2: []}
    for m in grid.sent:
        if m.metadata.message_type == "train":
            by_round[int(m.content["config"]["server-round"])].append(m.content.array_records["arrays"])
    assert all(len(a.keys()) == 0 for a in by_round[1])  # nothing down in round 1: no weights, no consensus
    for arrays in by_round[2]:
        assert set(arrays.keys()) == {f"extra/{FEDMD}consensus", f"extra/{FEDMD}round"}
        assert int(arrays[f"extra/{FEDMD}round"].numpy()[0]) == 1
        assert arrays[f"extra/{FEDMD}consensus"].numpy().shape == (20, strategy.num_classes)
    with pytest.raises(ValueError, match="transfer_fraction"):
        make(compose, tiny_overrides, "method=fedmd")
