"""FedProto: the prototype pull, the nearest-prototype prediction and the server's averaging on
hand numbers; three architectures in one federation exchanging prototypes only."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from method_helpers import ctx, role_args_of, train_messages
from test_felo import ARCHS, model_keys, train_replies
from test_strategy_base import make, run

from pflower.client_app.roles import build_role
from pflower.client_app.roles.fedproto import (
    PROTO,
    PrototypeClassifier,
    nearest_prototype_scores,
    prototype_loss,
    prototype_targets,
)
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.fedproto import aggregate_prototypes

PROTOS = torch.tensor([[0.0, 0.0], [4.0, 0.0], [9.0, 9.0]])
KNOWN = torch.tensor([1, 1, 0], dtype=torch.uint8)


def test_the_pull_targets_the_known_prototype_of_the_label_and_nothing_else():
    features = torch.tensor([[1.0, 1.0], [3.0, 2.0], [5.0, 5.0]])
    y = torch.tensor([0, 1, 2])  # class 2 has no prototype: the example's own features
    assert prototype_targets(features, y, PROTOS, KNOWN).tolist() == [[0.0, 0.0], [4.0, 0.0], [5.0, 5.0]]
    # squared errors 1 + 1, 1 + 4, 0 + 0 over 6 entries
    assert float(prototype_loss(features, y, PROTOS, KNOWN)) == pytest.approx(7 / 6)


def test_prediction_picks_the_nearest_known_prototype():
    features = torch.tensor([[1.0, 0.0], [3.0, 1.0], [9.0, 9.0]])
    scores = nearest_prototype_scores(features, PROTOS, KNOWN)
    assert scores[0, :2].tolist() == pytest.approx([-1.0, -9.0]) and scores[1, :2].tolist() == pytest.approx(
        [-10.0, -2.0]
    )
    # no prototype: 100 below the row's lowest known score (finite), never predicted, even at distance 0
    assert scores[:, 2].tolist() == pytest.approx([-109.0, -110.0, -262.0])  # [9, 9]: 162 to [0, 0], 106 to [4, 0]
    assert scores.argmax(1).tolist() == [0, 1, 1]


def test_the_server_averages_each_class_over_the_replies_holding_it():
    s = [np.array([[1.0, 1.0], [2.0, 0.0], [0.0, 0.0]]), np.array([[3.0, 5.0], [0.0, 0.0], [0.0, 0.0]])]
    n = [np.array([1, 4, 0]), np.array([3, 0, 0])]
    protos, known = aggregate_prototypes(s, n)
    assert protos.tolist() == [[2.0, 3.0], [2.0, 0.0], [0.0, 0.0]] and known.tolist() == [1, 1, 0]
    weighted, _ = aggregate_prototypes(s, n, "examples")  # class 0: (1 * [1, 1] + 3 * [3, 5]) / 4
    assert weighted[0].tolist() == [2.5, 4.0] and weighted[1].tolist() == [2.0, 0.0]


def test_the_client_predicts_with_the_prototypes_it_received(client):
    model, data, args = client
    plain = build_role("fedproto", role_args_of("fedproto"))
    assert plain.eval_model(model, data, args, ctx()) is model  # nothing received yet: the classifier
    d = int(list(model.groups.values())[-1].weight.shape[1])
    received = ctx()
    received.received_extra.update({PROTO + "S": torch.randn(10, d), PROTO + "M": torch.ones(10, dtype=torch.uint8)})
    assert isinstance(plain.eval_model(model, data, args, received), PrototypeClassifier)
    by_head = build_role("fedproto", role_args_of("fedproto", inference="classifier"))
    assert by_head.eval_model(model, data, args, received) is model
    metrics = plain.fit(model, data, args, received)
    assert metrics["proto_loss"] > 0 and set(received.upload_extra) == {PROTO + "s", PROTO + "n"}
    assert int(received.upload_extra[PROTO + "n"].sum()) == 2 * len(data.y_train)  # every pass of 2 epochs


def test_three_architectures_exchange_prototypes_only(compose, tiny_overrides):
    over = ["method=fedproto", "num_clients=3", "fraction=1.0", "optimizer=adam", "lr=0.003", "local_steps=2", *ARCHS]
    _, strategy = make(compose, tiny_overrides, *over)
    assert len({len(strategy.model.schema(c).groups) for c in range(3)}) == 3  # 2, 3 and 4 FC layers
    grid = InProcessGrid(3)
    run(strategy, grid, 2)
    assert all(not extras_of(m) for m in train_messages(grid, 1))  # round 1: nothing known yet
    for m in train_messages(grid, 2):
        assert not model_keys(m) and sorted(extras_of(m)) == ["M", "S"]
    replies = train_replies(grid)
    assert len(replies) == 6 and all(not model_keys(r) and sorted(extras_of(r)) == ["n", "s"] for r in replies)
    last = [extras_of(r) for r in replies[-3:]]
    protos, known = aggregate_prototypes([e["s"] for e in last], [e["n"] for e in last])
    np.testing.assert_allclose(strategy.prototypes, protos, rtol=1e-6)
    assert strategy.known.tolist() == known.tolist()


def extras_of(message) -> dict[str, np.ndarray]:
    arrays = message.content.array_records["arrays"]
    prefix = "extra/" + PROTO
    return {k[len(prefix) :]: arrays[k].numpy() for k in arrays.keys() if k.startswith(prefix)}
