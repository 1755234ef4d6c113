"""FedAS: the alignment loss, the Fisher trace and the aggregation weights on hand numbers; a
client aligning to its own previous model; a round in-process weighted by the Fisher traces."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from method_helpers import ctx, role_args_of
from test_strategy_base import make, run
from torch import nn

from pflower.client_app.roles import build_role
from pflower.client_app.roles.fedas import PREV, alignment_loss, fisher_trace
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.fedas import fisher_weights


def test_the_alignment_loss_on_hand_numbers():
    features = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 5.0]])
    y = torch.tensor([0, 0, 1])
    protos = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    # class 0: examples (1 + 9) / 4 entries; class 1 unknown: nothing
    assert float(alignment_loss(features, y, protos, torch.tensor([1, 0]))) == pytest.approx(2.5)
    # its batch mean [2, 0]: 4 / 2; class 1 known: 25 / 2
    assert float(alignment_loss(features, y, protos, torch.tensor([1, 1]), "batch_mean")) == pytest.approx(2.0 + 12.5)


def test_the_fisher_trace_and_the_weights_on_hand_numbers():
    model = nn.Linear(1, 2, bias=False)
    model.weight.data.zero_()  # logits 0: p = (1/2, 1/2)
    x, y = torch.tensor([[2.0]]), torch.tensor([0])
    # d NLL / d w = (p - onehot) x = (-1, 1) * 1/2 * 2: squared and summed, 2
    assert fisher_trace(model, x, y, 1, torch.device("cpu")) == pytest.approx(2.0)
    assert fisher_weights([1.0, 3.0], [10, 10]) == [0.25, 0.75]
    assert fisher_weights([0.0, 0.0], [10, 30]) == [0.25, 0.75]  # no information anywhere: by examples


def test_the_client_aligns_to_its_previous_model_and_keeps_the_trained_one(client):
    model, data, args = client
    role_ctx = ctx()
    role = build_role("fedas", role_args_of("fedas"))
    assert role.eval_model(model, data, args, role_ctx) is model  # first contact: the received model
    first = role.fit(model, data, args, role_ctx)
    assert "alignment_loss" not in first and first["fim_trace"] > 0 and math.isfinite(first["fim_trace"])
    kept = role_ctx.kept(PREV)
    assert all(torch.equal(kept[k], v) for k, v in model.state_dict().items())
    again = build_role("fedas", role_args_of("fedas")).fit(model, data, args, role_ctx)
    assert again["alignment_loss"] >= 0  # the second contact aligns first
    scored = role.eval_model(model, data, args, role_ctx)
    assert scored is not model and all(torch.equal(scored.state_dict()[k], v) for k, v in role_ctx.kept(PREV).items())


def test_scored_aligned_aligns_before_test_before_and_only_once(client):
    model, data, args = client
    role_ctx = ctx()
    build_role("fedas", role_args_of("fedas")).fit(model, data, args, role_ctx)  # a first round: kept
    received = {k: v.clone() for k, v in model.state_dict().items()}
    role = build_role("fedas", role_args_of("fedas", scored="aligned"))
    scored = role.eval_model(model, data, args, role_ctx)
    assert scored is model and role.aligned_loss is not None  # the received model, aligned in place
    assert not torch.equal(model.state_dict()["groups.conv1.0.weight"], received["groups.conv1.0.weight"])
    assert torch.equal(model.state_dict()["groups.classifier.weight"], received["groups.classifier.weight"])
    aligned = {k: v.clone() for k, v in model.state_dict().items()}
    role.align(model, data, args, role_ctx)  # a second call does nothing
    assert all(torch.equal(aligned[k], v) for k, v in model.state_dict().items())
    assert role.fit(model, data, args, role_ctx)["alignment_loss"] == role.aligned_loss


def test_a_round_averages_by_the_fisher_traces(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedas", "fraction=1.0")
    grid = InProcessGrid(4)
    records = run(strategy, grid, 2)
    assert all(0.25 <= r["largest_weight"] < 1 for r in records)  # 4 clients, none alone
    keys = [set(r.content.array_records["arrays"].keys()) for r in grid.replies if r.metadata.message_type == "train"]
    assert all(not any(k.startswith("groups.classifier") for k in ks) for ks in keys)  # head=personal
    replies = [r for r in grid.replies if r.metadata.message_type == "train"]
    traces = [float(r.content["metrics"]["fim_trace"]) for r in replies]
    assert len(traces) == 8 and np.all(np.array(traces) > 0)
    last = replies[-4:]  # round 2: the global body is their average by Fisher trace, not by examples
    key = "groups.conv1.0.weight"
    w = np.array(traces[-4:]) / sum(traces[-4:])
    expected = sum(wi * r.content.array_records["arrays"][key].numpy() for wi, r in zip(w, last))
    np.testing.assert_allclose(strategy.model.global_arrays[key], expected, rtol=1e-5, atol=1e-7)
