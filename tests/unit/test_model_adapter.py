"""Any torch.nn.Module as a pflower model (pflower.models.adapt): groups, hooks, refusals."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from user_code import Net

from pflower.models import AdaptedNet, LayeredNet, ModelAdaptError, adapt, build_model
from pflower.models.schema import ModelSchema


def test_the_top_level_children_with_parameters_are_the_groups_and_forward_is_the_modules_own():
    torch.manual_seed(0)
    net = Net()
    model = adapt(net, in_shape=(3, 32, 32))
    assert model.group_names == ["conv1", "conv2", "fc1", "fc2", "fc3"]  # the shared MaxPool2d is no group
    assert list(model.state_dict())[:2] == ["groups.conv1.weight", "groups.conv1.bias"]
    assert len(model.state_dict()) == len(net.state_dict())  # every tensor once
    x = torch.randn(4, 3, 32, 32)
    assert torch.equal(model(x), net(x))
    outputs = model.forward_groups(x)
    assert [tuple(o.shape) for o in outputs] == [(4, 6, 28, 28), (4, 16, 10, 10), (4, 120), (4, 84), (4, 10)]
    assert torch.equal(outputs[-1], net(x))
    z = model.features(x)  # the classifier's input, and the classifier maps it to the logits
    assert z.shape == (4, 84) and torch.allclose(model.groups["fc3"](z), net(x))


def test_a_copy_is_independent_and_its_groups_stay_the_modules_tensors():
    model = adapt(Net())
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for p in clone.parameters():
            p.zero_()
    x = torch.randn(2, 3, 32, 32)
    assert torch.count_nonzero(clone(x)) == 0  # the copy's forward uses the copy's (zeroed) tensors
    assert torch.count_nonzero(model(x)) > 0
    clone.load_state_dict(model.state_dict())
    assert torch.equal(clone(x), model(x))


def test_train_and_eval_reach_the_wrapped_module():
    class Dropper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(nn.functional.dropout(x, 0.9, training=self.training))

    model = adapt(Dropper())
    model.eval()
    x = torch.ones(3, 4)
    assert torch.equal(model(x), model(x))  # no dropout in eval mode


def test_named_groups_several_modules_each_and_a_submodule_path():
    model = adapt(
        Net(), groups={"body": ["conv1", "conv2"], "hidden": ["fc1", "fc2"], "head": "fc3"}, in_shape=(3, 32, 32)
    )
    assert model.group_names == ["body", "hidden", "head"]
    assert "groups.body.conv1.weight" in model.state_dict()
    schema = ModelSchema.of(model, "net", {"name": "custom"})
    assert schema.group_keys["head"] == ("groups.head.weight", "groups.head.bias")
    outs = model.forward_groups(torch.randn(2, 3, 32, 32))
    assert [tuple(o.shape) for o in outs] == [(2, 16, 10, 10), (2, 84), (2, 10)]  # each group's last module's output


@pytest.mark.parametrize(
    "groups, message",
    [
        ({"body": ["conv1", "conv2", "fc1", "fc2"]}, "no layer group holds ['fc3.weight'"),
        ({"a": ["conv1"], "b": ["conv1", "conv2", "fc1", "fc2", "fc3"]}, "layer groups 'a' and 'b' share tensors"),
        ({"a": ["conv9"]}, "has no submodule 'conv9'"),
        ({"a.b": ["conv1"]}, "without '.'"),
        (
            {"head": ["fc3"], "body": ["conv1", "conv2", "fc1", "fc2"]},
            "the layer groups run in the order ['body', 'head'], not ['head', 'body']",
        ),
        (
            {"body": ["conv1", "conv2", "fc1", "fc3"], "mid": ["fc2"]},
            "output is not the output of its last layer group 'mid'",
        ),
    ],
)
def test_groups_that_do_not_cover_the_model_once_in_forward_order_are_refused(groups, message):
    with pytest.raises(ModelAdaptError) as err:
        adapt(Net(), groups=groups, in_shape=(3, 32, 32))
    assert message in str(err.value)


def test_tensors_held_by_the_root_module_and_a_wrong_input_shape_are_refused():
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.scale = nn.Parameter(torch.ones(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) * self.scale

    with pytest.raises(ModelAdaptError, match=r"holds \['scale'\] itself"):
        adapt(Scaled())
    with pytest.raises(ModelAdaptError, match=r"does not run on inputs of shape \[1, 28, 28\]"):
        adapt(Net(), in_shape=(1, 28, 28))
    with pytest.raises(ModelAdaptError, match="must be a torch.nn.Module"):
        adapt(lambda x: x)  # type: ignore[arg-type]


def test_a_layered_net_passes_through_and_model_custom_builds_from_a_dotted_path():
    lenet = build_model("lenet5", (1, 28, 28), 10, seed=0)
    assert adapt(lenet) is lenet
    a = build_model("custom", (3, 32, 32), 10, seed=3, target="user_code:Net")
    b = build_model("custom", (3, 32, 32), 10, seed=3, target="user_code:Net")
    assert isinstance(a, AdaptedNet) and isinstance(a, LayeredNet)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())  # seeded
    mobile = build_model("custom", (3, 32, 32), 10, target="user_code:mobilenet")
    assert mobile.group_names == ["features", "classifier"]
    with pytest.raises(ValueError, match="cannot import 'no_such_pkg.nets'"):
        build_model("custom", (3, 32, 32), 10, target="no_such_pkg.nets:Net")
    with pytest.raises(ValueError, match="name a function as 'package.module:function'"):
        build_model("custom", (3, 32, 32), 10, target="user_code.Net")
