"""FedGKT: the distillation loss by hand, the server's training and scoring, the client's loss by
sample index and its uploads, and the strategy's messages (no weights up, the server's logits and
model down)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from method_helpers import ctx
from test_strategy_base import make, run

from pflower.client_app.roles.fedgkt import GKT, FedGKTRole, gkt_loss
from pflower.client_app.training import TrainArgs
from pflower.federated_data import ClientData
from pflower.models import build_model
from pflower.models.gkt import ExtractorThenHead, kd_loss, server_head
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.fedgkt_math import head_accuracy, head_logits, train_server_head

HETERO = [
    "model=mixed",
    "~model.archs",
    "+model.archs={l2: {name: lenet5, fc_layers: 2, feature_dim: 16},"
    " l3: {name: lenet5, fc_layers: 3, feature_dim: 16}}",
    "num_clients=4",
    "fraction=1.0",
    "method.hidden=[32]",
]


def test_kd_loss_by_hand():
    teacher, student = torch.tensor([[math.log(3.0), 0.0]]), torch.zeros(1, 2)
    # T = 1: KL([0.75, 0.25] || [0.5, 0.5]) = 0.75 ln 1.5 + 0.25 ln 0.5
    assert kd_loss(student, teacher, 1.0).item() == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5))
    # T = 2: p = [sqrt3, 1] / (sqrt3 + 1), times T^2 = 4
    p = np.array([math.sqrt(3.0), 1.0]) / (math.sqrt(3.0) + 1)
    assert kd_loss(student, teacher, 2.0).item() == pytest.approx(4 * float((p * np.log(p / 0.5)).sum()), rel=1e-5)
    assert kd_loss(teacher, teacher, 3.0).item() == pytest.approx(0.0, abs=1e-5)  # float32 rounding


def test_the_server_head_learns_separable_features_and_scores_them():
    g = np.random.default_rng(0)
    y = g.integers(0, 3, 300)
    h = np.eye(3, dtype=np.float32)[y] * 3 + g.normal(0, 0.3, (300, 3)).astype(np.float32)
    z = np.eye(3, dtype=np.float32)[y] * 5  # the clients are confident and right
    head = server_head(3, 3, [16], seed=1)
    opt = torch.optim.Adam(head.parameters(), lr=0.01)
    before = head_accuracy(head, h, y)
    losses = [
        train_server_head(
            head, opt, h, y, z, torch.Generator().manual_seed(e), epochs=1, batch_size=32, alpha=1.0, temperature=3.0
        )
        for e in range(20)
    ]
    assert losses[-1] < losses[0] / 4 and head_accuracy(head, h, y) == 300 > before
    assert head_logits(head, h).shape == (300, 3) and head_logits(head, h).dtype == np.float32
    # the same seeds give the same head: the server's training is reproducible (resume)
    again = server_head(3, 3, [16], seed=1)
    opt2 = torch.optim.Adam(again.parameters(), lr=0.01)
    for e in range(20):
        train_server_head(
            again, opt2, h, y, z, torch.Generator().manual_seed(e), epochs=1, batch_size=32, alpha=1.0, temperature=3.0
        )
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), again.state_dict().values()))


def test_the_client_loss_looks_labels_and_teacher_up_by_sample_index():
    model = build_model("lenet5", (1, 28, 28), 3, seed=0, fc_layers=2, feature_dim=8)
    x = torch.randn(4, 1, 28, 28)
    labels, teacher = torch.tensor([0, 1, 2, 1]), torch.randn(4, 3)
    idx = torch.tensor([2, 0])
    got = gkt_loss(labels, teacher, 0.5, 3.0)(model, x[idx], idx)
    logits = model(x[idx])
    want = torch.nn.functional.cross_entropy(logits, labels[idx]) + 0.5 * kd_loss(logits, teacher[idx], 3.0)
    assert torch.isclose(got, want)
    assert torch.isclose(
        gkt_loss(labels, None, 0.5, 3.0)(model, x[idx], idx), torch.nn.functional.cross_entropy(logits, labels[idx])
    )


def test_the_role_uploads_features_logits_labels_and_is_evaluated_through_the_server_model():
    model = build_model("lenet5", (1, 28, 28), 3, seed=0, fc_layers=2, feature_dim=8)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 1, 28, 28, generator=g), torch.tensor([0, 1, 2] * 4)
    data = ClientData(0, x, y, x[:5], y[:5], 3)
    head = server_head(8, 3, [4], seed=3)
    received = {GKT + "server/" + k: v.clone() for k, v in head.state_dict().items()}
    received[GKT + "z"] = torch.randn(12, 3)
    c = ctx()
    c.received_extra = received
    role = FedGKTRole({"alpha": 1.0, "temperature": 3.0, "feature_dim": 8, "hidden": [4]})
    evaluated = role.eval_model(model, data, TrainArgs(lr=0.01, epochs=1, batch_size=4), c)
    assert isinstance(evaluated, ExtractorThenHead)
    with torch.no_grad():
        torch.testing.assert_close(evaluated.eval()(x[:2]), head(model.eval().features(x[:2]).flatten(1)))
    role.fit(model, data, TrainArgs(lr=0.01, epochs=1, batch_size=4), c)
    up = c.upload_extra
    assert up[GKT + "h"].shape == (12, 8) and up[GKT + "z"].shape == (12, 3) and up[GKT + "ht"].shape == (5, 8)
    assert torch.equal(up[GKT + "y"], y) and torch.equal(up[GKT + "yt"], y[:5])
    c.received_extra[GKT + "z"] = torch.randn(11, 3)  # not one row per training sample
    with pytest.raises(ValueError, match="logits of shape"):
        role.fit(model, data, TrainArgs(lr=0.01, epochs=1, batch_size=4), c)


def test_no_weights_go_up_and_each_client_gets_the_logits_of_its_own_samples(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedgkt", *HETERO)
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=2)
    for reply in (r for r in grid.replies if r.metadata.message_type == "train"):
        keys = set(reply.content.array_records["arrays"].keys())
        assert keys == {f"extra/{GKT}{k}" for k in ("h", "z", "y", "ht", "yt")}  # features, not weights
    second = [
        m for m in grid.sent if m.metadata.message_type == "train" and int(m.content["config"]["server-round"]) == 2
    ]
    for m in second:
        cid = int(m.content["config"]["client-id"])
        arrays = m.content.array_records["arrays"]
        z = arrays[f"extra/{GKT}z"].numpy()
        assert z.shape == (strategy.clients[cid].num_train, 10)
        assert not any(k.startswith("groups.") for k in arrays.keys())
    assert all(0.0 <= r["server_acc"] <= 1.0 and r["stored_clients"] == 4 for r in records)
    evaluate = [m for m in grid.sent if m.metadata.message_type == "evaluate"]
    assert evaluate and all(f"extra/{GKT}server/0.weight" in m.content.array_records["arrays"].keys() for m in evaluate)
