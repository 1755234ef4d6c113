"""pflower as a library in a Flower app of one's own: a strategy from the public API with a user's
module, the client builder's hooks, and the Flower arguments pflower does not take."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, RecordDict
from user_code import Digits32, Net, client_digits32

from pflower.client_app.user_parts import ClientHooks
from pflower.federated_data.datasets import DataHookError
from pflower.protocol.wire import TaskSpec
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies import STRATEGIES, FedCMD, FedPer, client_spec


def context(partition: int, partitions: int = 4) -> Context:
    return Context(
        run_id=1,
        node_id=partition + 1,
        node_config={"partition-id": partition, "num-partitions": partitions},
        state=RecordDict(),
        run_config={},
    )


def test_a_strategy_takes_the_users_module_and_names_its_layer_groups():
    strategy = FedCMD(Net(), client_spec(lr=0.05), num_clients=4, fraction_train=0.5, kp=2)
    assert strategy.model.groups == ["conv1", "conv2", "fc1", "fc2", "fc3"]
    assert strategy.model.schema().keys(["fc3"]) == ["groups.fc3.weight", "groups.fc3.bias"]
    spec = strategy.run.client_spec
    assert spec["train"]["lr"] == 0.05 and spec["train"]["epochs"] == 1 and len(spec["run"]) == 8


def test_start_refuses_a_train_config_that_contradicts_the_client_spec_instead_of_dropping_it():
    strategy = FedPer(Net(), client_spec(), num_clients=2)
    with pytest.raises(ValueError, match=r"train_config sets \{'lr': 0.1\}, which client_spec sets otherwise"):
        strategy.start(InProcessGrid(2), num_rounds=1, train_config=ConfigRecord({"lr": 0.1}))


def test_the_builders_hooks_seed_the_model_and_convert_the_data_once():
    hooks = ClientHooks(model=Net, data=client_digits32)
    spec = TaskSpec(run="r", seed=7, model={}, data={}, train={})
    a, b = hooks.model_of(spec, (3, 32, 32)), hooks.model_of(spec, (3, 32, 32))
    assert a is not b and all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    other = hooks.model_of(TaskSpec(run="r", seed=8, model={}, data={}, train={}), (3, 32, 32))
    assert not torch.equal(a.state_dict()["groups.fc3.weight"], other.state_dict()["groups.fc3.weight"])
    data = hooks.data_of(context(1), 1)
    assert hooks.data_of(context(1), 1) is data  # loaded once per process and client
    assert (data.num_train, data.num_test, data.num_classes) == (80, 20, 10)
    expected = Digits32(np.arange(400)[1::4][:80])[0][0]
    assert torch.equal(data.x_train[0], expected)  # the user's own normalisation kept


def test_a_data_function_without_a_test_split_is_refused():
    hooks = ClientHooks(model=Net, data=lambda context: Digits32(np.arange(10)))
    with pytest.raises(DataHookError, match=r"must return \(train, test\)"):
        hooks.data_of(context(0), 0)


class SoftNet(torch.nn.Module):
    """Flower-style Net that ends in a LogSoftmax child: not the logits pflower's clients train on."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.out = torch.nn.Linear(8, 6), torch.nn.Linear(6, 3), torch.nn.LogSoftmax(dim=1)

    def forward(self, x):
        return self.out(self.fc2(torch.relu(self.fc1(x))))


class ConvHead(torch.nn.Module):
    """A model whose last layer group is a Conv2d: no linear classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(1, 4, 3), torch.nn.Conv2d(4, 3, 3)

    def forward(self, x):
        return self.conv2(torch.relu(self.conv1(x))).mean(dim=(2, 3))


@pytest.mark.parametrize(
    "spec, message",
    [
        ({}, r"client_spec is empty: .* build it with pflower.strategies.client_spec\(lr=\.\.\."),
        ({"lr": 0.1}, r"client_spec lacks \['run', 'seed', 'device', 'train'\] \(it has \['lr'\]\)"),
        ({**client_spec(), "train": {"lr": 0.1}}, r"client_spec lacks \['train.epochs', 'train.batch_size'"),
        ([0.1], r"client_spec must be a mapping, got list"),
    ],
)
def test_an_empty_or_partial_client_spec_is_one_line(spec, message):
    from pflower.strategies.base.client_spec import SetupError

    with pytest.raises(SetupError, match=message) as err:
        FedPer(Net(), spec, num_clients=2)
    assert err.value.user_error and "\n" not in str(err.value)


def test_a_softmax_after_the_last_layer_is_refused_for_every_method():
    from pflower.models.adapter import ModelAdaptError
    from pflower.strategies import FedAvg

    for method in (FedPer, FedAvg):
        with pytest.raises(ModelAdaptError, match=r"SoftNet.out \(LogSoftmax\) comes after the last layer group 'fc2'"):
            method(SoftNet(), client_spec(), num_clients=2)


def test_a_method_that_reads_a_classifier_refuses_a_conv_head_and_others_take_it():
    from pflower.strategies import FedAvg
    from pflower.strategies.base.client_spec import SetupError

    with pytest.raises(SetupError, match=r"method 'fedcmd' reads the model's last layer group as its classifier"):
        FedCMD(ConvHead(), client_spec(), num_clients=2, kp=1)
    with pytest.raises(SetupError, match=r"'conv2' holds \{'groups.conv2.weight': \[3, 4, 3, 3\]"):
        FedPer(ConvHead(), client_spec(), num_clients=2)
    assert FedAvg(ConvHead(), client_spec(), num_clients=2).model.groups == ["conv1", "conv2"]  # no classifier read


def test_the_servers_model_is_drawn_from_the_seed_and_the_users_module_is_left_alone():
    net = Net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    a = FedPer(net, client_spec(), num_clients=2, seed=3).model.global_arrays
    b = FedPer(Net(), client_spec(), num_clients=2, seed=3).model.global_arrays  # another Net(), another draw
    c = FedPer(Net(), client_spec(), num_clients=2, seed=4).model.global_arrays
    assert all(np.array_equal(a[k], b[k]) for k in a)  # the same seed: the same start, whatever Net() drew
    assert not np.array_equal(a["groups.fc3.weight"], c["groups.fc3.weight"])
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # the caller's module unchanged


FLOWER_FEDAVG_ARGS = {"fraction_train": 0.5, "min_train_nodes": 2, "min_available_nodes": 4}


@pytest.mark.parametrize("method", sorted(STRATEGIES))
def test_every_method_takes_the_arguments_a_flower_user_passes_to_fedavg(method):
    """FedAvg(fraction_train=, min_train_nodes=, min_available_nodes=) as in Flower's quickstart,
    with the model and the client spec in front."""
    from pflower.models import build_model

    spec = client_spec()
    if method == "fedmd":
        spec["data"] = {"transfer_fraction": 0.1}  # FedMD's labelled transfer set (dataset.transfer_fraction)
    # a method whose warm-up is a share of the run (FedAP, pFedSim) is told the run's rounds
    rounds = {"total_rounds": 200} if "total_rounds" in STRATEGIES[method].options_type.names() else {}
    model = build_model("lenet5", (1, 28, 28), 10, seed=0)
    strategy = STRATEGIES[method](model, spec, num_clients=4, **FLOWER_FEDAVG_ARGS, **rounds)
    assert (strategy.run.fraction, strategy.run.min_clients, strategy.min_available) == (0.5, 2, 4)
    assert strategy.run.sample_size() == 2


@pytest.mark.parametrize(
    "keyword, message",
    [
        ({"fraction": 0.5}, r"fraction= is Flower's fraction_train= in pflower's strategies: pass fraction_train="),
        ({"min_clients": 2}, r"min_clients= is Flower's min_train_nodes="),
        ({"min_available": 2}, r"min_available= is Flower's min_available_nodes="),
        ({"min_evaluate_nodes": 2}, r"min_evaluate_nodes= is not taken: pflower's per-round evaluation draws"),
        ({"train_metrics_aggr_fn": len}, r"train_metrics_aggr_fn= is not taken: pflower aggregates"),
    ],
)
def test_old_names_and_flower_keywords_pflower_does_not_take_are_one_line(keyword, message):
    from pflower.strategies.base.client_spec import SetupError

    with pytest.raises(SetupError, match=message) as err:
        FedPer(Net(), client_spec(), num_clients=4, **keyword)
    assert err.value.user_error


def test_the_client_builder_takes_feature_vectors_and_an_mlp():
    """build_clientapp's hooks with tabular data: (train, test) pairs of [N, 64] vectors, the user's MLP."""
    from user_code import MLP, load_digit_vectors

    x, y = load_digit_vectors(100)
    hooks = ClientHooks(model=MLP, data=lambda context: ((x[:80], y[:80]), (x[80:], y[80:])))
    data = hooks.data_of(context(0), 0)
    assert data.x_train.shape == (80, 64) and torch.allclose(data.x_train, torch.from_numpy(x[:80]).float())
    model = hooks.model_of(TaskSpec(run="r", seed=1, model={}, data={}, train={}), tuple(data.x_train.shape[1:]))
    assert model(data.x_test).shape == (20, 10) and model.group_names == ["fc1", "fc2", "classifier"]
