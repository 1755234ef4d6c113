"""FedRoD: the balanced softmax on hand-worked numbers, which parameters each loss reaches under
both readings, the personal head kept on the client and never sent (the in-process grid)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from method_helpers import ctx, replied_keys, role_args_of, same
from test_strategy_base import make, run
from torch import nn

from pflower.client_app.roles import build_role
from pflower.client_app.roles.fedrod import PREFIX, RoDNet, balanced_softmax_loss, label_counts
from pflower.simulation.inprocess import InProcessGrid, personal_state


def test_the_balanced_softmax_adds_the_log_of_the_label_counts():
    logits, y = torch.zeros(1, 2), torch.tensor([0])
    # logits [log 3, 0]: -log(3 / 4)
    assert balanced_softmax_loss(logits, y, torch.tensor([3.0, 1.0]), 1.0).item() == pytest.approx(math.log(4 / 3))
    # gamma 0 is plain cross-entropy (0 ** 0 = 1: a missing class too); gamma 2 squares the prior
    assert balanced_softmax_loss(logits, y, torch.tensor([3.0, 0.0]), 0.0).item() == pytest.approx(math.log(2))
    assert balanced_softmax_loss(logits, y, torch.tensor([3.0, 1.0]), 2.0).item() == pytest.approx(math.log(10 / 9))
    # a class the client lacks cannot take probability from its own: logits [log 2, -inf]
    assert balanced_softmax_loss(torch.tensor([[0.0, 5.0]]), y, torch.tensor([2.0, 0.0]), 1.0).item() == 0.0
    assert label_counts(torch.tensor([2, 0, 2, 2]), 4).tolist() == [1.0, 0.0, 3.0, 0.0]


class _Net(nn.Module):
    """A body and a classifier group, as LayeredNet names them."""

    def __init__(self) -> None:
        super().__init__()
        self.groups = nn.ModuleDict({"body": nn.Linear(3, 4), "classifier": nn.Linear(4, 2)})
        self.group_names = ["body", "classifier"]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.groups["body"](x)


@pytest.mark.parametrize(("reading", "body_learns"), [("on_generic", False), ("separate", True)])
def test_the_personal_loss_reaches_the_body_only_when_separate(reading, body_learns):
    torch.manual_seed(0)
    net = _Net()
    rod = RoDNet(net, nn.Linear(4, 2), reading)
    x = torch.randn(5, 3)
    generic, personal = rod.heads(x)
    z = net.features(x)
    expected = net.groups["classifier"](z) + rod.p_head(z) if reading == "on_generic" else rod.p_head(z)
    assert torch.allclose(personal, expected) and torch.allclose(rod(x), expected)
    nn.functional.cross_entropy(personal, torch.tensor([0, 1, 0, 1, 1])).backward()
    assert (net.groups["body"].weight.grad is not None) == body_learns
    assert net.groups["classifier"].weight.grad is None  # the generic head learns from the balanced softmax only
    assert rod.p_head.weight.grad is not None


def test_the_client_keeps_its_personal_head_and_evaluates_generic_plus_personal(client):
    model, data, args = client
    role_ctx = ctx()
    role = build_role("fedrod", role_args_of("fedrod"))
    classifier = {k: v.clone() for k, v in model.groups["classifier"].state_dict().items()}
    before = role.eval_model(model, data, args, role_ctx)  # first contact: the head starts as the classifier
    assert all(torch.equal(before.p_head.state_dict()[k], v) for k, v in classifier.items())
    metrics = role.fit(model, data, args, role_ctx)
    assert set(metrics) == {"train_loss"} and math.isfinite(metrics["train_loss"])
    head = {k[len(PREFIX) :]: v for k, v in role_ctx.extra_state.items()}
    assert set(head) == set(classifier)
    trained = {k: v.detach() for k, v in model.groups["classifier"].state_dict().items()}
    assert not same(head, trained) and not same(head, classifier)  # both heads learned, apart
    # next round: a new generic model arrives; the persisted personal head sits on top of it
    next_role = build_role("fedrod", role_args_of("fedrod"))
    evaluated = next_role.eval_model(model, data, args, ctx(extra=role_ctx.extra_state))
    assert all(torch.equal(evaluated.p_head.state_dict()[k], v) for k, v in head.items())
    x = data.x_test[:4]
    with torch.no_grad():
        assert torch.allclose(evaluated(x), model(x) + evaluated.p_head(model.features(x)))


def test_a_round_sends_the_whole_model_and_keeps_the_personal_head_on_each_node(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedrod", "fraction=1.0")
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=1)
    assert not records[0]["dropped"] and all(k == set(strategy.model.global_arrays) for k in replied_keys(grid))
    weight = "extra.fedrod.p_head.weight"
    for c in grid.contexts.values():
        assert personal_state(c)[weight].shape == strategy.model.global_arrays["groups.classifier.weight"].shape
    heads = [personal_state(c)[weight] for c in grid.contexts.values()]
    assert not all(np.array_equal(heads[0], h) for h in heads[1:])  # each client's own
