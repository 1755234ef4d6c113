"""HeteroFL: the partial average by hand, width-scaled LeNet-5, the client's masked loss and sBN,
and the strategy (sub-models cut from one global model; at full width it is FedAvg)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from method_helpers import ctx
from test_strategy_base import make, run

from pflower.client_app.roles.heterofl import (
    HETEROFL_CLASSES,
    HeteroFLRole,
    class_presence,
    masked_cross_entropy,
    static_bn_statistics,
)
from pflower.client_app.training import TrainArgs
from pflower.federated_data import ClientData
from pflower.models import build_model
from pflower.models.lenet import Scaler
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.heterofl_math import fits_inside, partial_average, slice_arrays

WIDTHS = ["model=lenet5_widths", "num_clients=6", "fraction=1.0"]


# ---------------------------------------------------------------------- the math, by hand
def test_partial_average_counts_each_entry_over_the_clients_that_hold_it():
    glob = {"w": np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], np.float32)}
    small = {"w": np.array([[4.0]], np.float32)}  # holds w[0, 0] only
    mid = {"w": np.array([[2.0, 6.0]], np.float32)}  # w[0, :2]
    out = partial_average(glob, [small, mid], [1.0, 1.0])["w"]
    # w[0,0]: (4 + 2) / 2 = 3; w[0,1]: 6 (mid alone); the rest nobody held: kept at 1
    np.testing.assert_array_equal(out, [[3.0, 6.0, 1.0], [1.0, 1.0, 1.0]])
    assert out.dtype == np.float32
    # weighted by examples (3 and 1): w[0,0] = (3*4 + 1*2) / 4 = 3.5
    np.testing.assert_allclose(partial_average(glob, [small, mid], [3.0, 1.0])["w"][0, :2], [3.5, 6.0])


def test_partial_average_counts_a_classifier_row_only_for_clients_with_the_class():
    glob = {"b": np.zeros(3, np.float32)}
    a, b = {"b": np.array([3.0, 9.0, 5.0], np.float32)}, {"b": np.array([1.0, 7.0, 2.0], np.float32)}
    masks = [{"b": np.array([1, 0, 1], bool)}, {"b": np.array([1, 1, 0], bool)}]
    # row 0 both: 2; row 1 only b: 7; row 2 only a: 5
    np.testing.assert_array_equal(partial_average(glob, [a, b], [1.0, 1.0], masks)["b"], [2.0, 7.0, 5.0])
    # a row nobody has keeps its value
    none = [{"b": np.array([0, 0, 1], bool)}, {"b": np.array([0, 0, 1], bool)}]
    np.testing.assert_array_equal(partial_average(glob, [a, b], [1.0, 1.0], none)["b"], [0.0, 0.0, 3.5])


def test_slice_and_refusal_of_a_tensor_that_is_no_block():
    full = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    np.testing.assert_array_equal(slice_arrays(full, {"w": (2, 2)})["w"], [[0, 1], [4, 5]])
    assert fits_inside((2, 2), (3, 4)) and not fits_inside((4, 2), (3, 4)) and not fits_inside((2,), (3, 4))
    with pytest.raises(ValueError, match="not a block"):
        partial_average(full, [{"w": np.zeros((4, 1), np.float32)}], [1.0])


# ---------------------------------------------------------------------- the model
def test_width_scaled_lenet_is_the_leading_block_of_the_full_one():
    full = build_model("lenet5", (1, 28, 28), 10, seed=0, width=1.0, scaler=True)
    quarter = build_model("lenet5", (1, 28, 28), 10, seed=0, width=0.25, scaler=True)
    fs, qs = full.state_dict(), quarter.state_dict()
    assert fs.keys() == qs.keys()
    assert all(fits_inside(qs[k].shape, fs[k].shape) for k in fs)
    assert tuple(qs["groups.conv1.0.weight"].shape) == (2, 1, 5, 5)  # ceil(6 / 4)
    assert tuple(qs["groups.fc1.0.weight"].shape) == (30, 4 * 16)  # 4 channels x 4 x 4 positions
    assert tuple(qs["groups.classifier.weight"].shape) == (10, 21)  # ceil(84 / 4); classes unchanged
    plain = build_model("lenet5", (1, 28, 28), 10, seed=0)
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            plain.state_dict().values(), build_model("lenet5", (1, 28, 28), 10, seed=0, width=1.0).state_dict().values()
        )
    )
    with pytest.raises(ValueError, match="width must be in"):
        build_model("lenet5", (1, 28, 28), 10, seed=0, width=1.5)


def test_scaler_divides_by_the_rate_in_training_only():
    s = Scaler(0.25)
    x = torch.ones(2)
    assert torch.equal(s.train()(x), torch.full((2,), 4.0)) and torch.equal(s.eval()(x), x)


# ---------------------------------------------------------------------- the client
def test_masked_loss_zeroes_absent_classes_and_leaves_their_rows_untrained():
    torch.manual_seed(0)
    model = build_model("lenet5", (1, 28, 28), 4, seed=0)
    x, y = torch.randn(8, 1, 28, 28), torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])
    classes = class_presence(y, 4)
    assert classes.tolist() == [1, 1, 0, 0]
    loss = masked_cross_entropy(classes)(model, x, y)
    logits = model(x).masked_fill(torch.tensor([False, False, True, True]), 0.0)
    assert torch.isclose(loss, torch.nn.functional.cross_entropy(logits, y))
    loss.backward()
    grad = model.groups.classifier.weight.grad
    assert torch.all(grad[2:] == 0) and torch.any(grad[:2] != 0)


def test_static_bn_is_the_batch_mean_of_the_evaluation_mode_statistics():
    model = build_model("lenet5", (1, 28, 28), 10, seed=0, width=0.5, scaler=True)
    x = torch.randn(20, 1, 28, 28)
    static_bn_statistics(model, x, torch.device("cpu"), batch_size=10)
    bn = model.groups.conv1[2]
    with torch.no_grad():
        h = [model.groups.conv1[0](x[i : i + 10]) for i in (0, 10)]  # the scaler is off in evaluation
    expect = torch.stack([b.mean(dim=(0, 2, 3)) for b in h]).mean(0)
    torch.testing.assert_close(bn.running_mean, expect)
    assert bn.momentum == 0.1 and model.training  # restored as it was


def test_role_uploads_its_classes_and_evaluates_with_measured_statistics():
    model = build_model("lenet5", (1, 28, 28), 10, seed=0, width=0.5, scaler=True)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 1, 28, 28, generator=g), torch.tensor([3, 7] * 20)
    data = ClientData(0, x, y, x[:10], y[:10], 10)
    role = HeteroFLRole({"label_split": True, "static_bn": True})
    c = ctx()
    before = role.eval_model(model, data, TrainArgs(lr=0.01, epochs=1, batch_size=8), c)
    assert before is not model and before.groups.conv1[2].num_batches_tracked > 0
    role.fit(model, data, TrainArgs(lr=0.01, epochs=1, batch_size=8), c)
    assert c.upload_extra[HETEROFL_CLASSES].tolist() == [0, 0, 0, 1, 0, 0, 0, 1, 0, 0]


# ---------------------------------------------------------------------- the strategy
def test_each_level_receives_its_block_of_the_one_global_model(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=heterofl", *WIDTHS)
    assert strategy.full_arch == "a" and strategy.model.arch_of == {0: "c", 1: "c", 2: "b", 3: "b", 4: "a", 5: "a"}
    full_before = {k: v.copy() for k, v in strategy.model.arrays["a"].items()}
    grid = InProcessGrid(6)
    records = run(strategy, grid, rounds=1)
    for m in grid.sent:
        if m.metadata.message_type != "train":
            continue
        cid = int(m.content.config_records["config"]["client-id"])
        spec = json.loads(m.content.config_records["config"]["spec"])
        assert spec["arch"] == strategy.model.arch_of[cid] and spec["keep"] == "none"
        for key, arr in m.content.array_records["arrays"].items():
            value = arr.numpy()
            np.testing.assert_array_equal(value, full_before[key][tuple(slice(0, s) for s in value.shape)])
    assert records[0]["clients@a"] == records[0]["clients@c"] == 2
    full = strategy.global_record()  # Flower's result: the widest level, not the first architecture
    assert all(full[k].numpy().shape == v.shape for k, v in strategy.model.arrays["a"].items())
    # the full model's entries outside every sub-model block were trained by the a clients alone
    assert not np.array_equal(strategy.model.arrays["a"]["groups.fc1.0.weight"], full_before["groups.fc1.0.weight"])


def test_at_full_width_with_fedavg_weighting_and_no_label_split_it_is_fedavg(compose, tiny_overrides):
    common = [*tiny_overrides, "model=lenet5", "+model.scaler=true"]
    _, hetero = make(compose, common, "method=heterofl", "method.weighting=examples", "method.label_split=false")
    _, fedavg = make(compose, common, "method=fedavg")
    for strategy in (hetero, fedavg):
        run(strategy, InProcessGrid(4), rounds=2)
    for key, value in fedavg.model.global_arrays.items():
        np.testing.assert_array_equal(hetero.model.global_arrays[key], value, err_msg=key)


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_dynamic_levels_redraw_each_round_and_evaluate_at_the_static_level(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=heterofl", "method.assignment=dynamic", *WIDTHS)
    static = dict(strategy.model.arch_of)
    grid = InProcessGrid(6)
    run(strategy, grid, rounds=2)
    archs = [
        (
            int(m.content.config_records["config"]["server-round"]),
            int(m.content.config_records["config"]["client-id"]),
            json.loads(m.content.config_records["config"]["spec"])["arch"],
        )
        for m in grid.sent
        if m.metadata.message_type == "train"
    ]
    trained = {(r, c): a for r, c, a in archs}
    assert any(trained[(1, c)] != static[c] or trained[(2, c)] != static[c] for c in range(6))
    again = make(compose, tiny_overrides, "method=heterofl", "method.assignment=dynamic", *WIDTHS)[1]
    again.assign_levels(range(6), 2)
    assert {c: again.model.arch_of[c] for c in range(6)} == {c: trained[(2, c)] for c in range(6)}  # from (seed, round)
    evaluated = {
        int(m.content.config_records["config"]["client-id"]): json.loads(m.content.config_records["config"]["spec"])[
            "arch"
        ]
        for m in grid.sent
        if m.metadata.message_type == "evaluate"
    }
    assert evaluated == static  # the final evaluation: every client at its static level


def test_refuses_architectures_that_are_not_widths_of_one_model(compose, tiny_overrides):
    with pytest.raises(ValueError, match="width levels of one model"):
        make(compose, tiny_overrides, "method=heterofl", "model=mixed", "num_clients=6", "fraction=1.0")


def test_a_device_announcing_its_width_trains_that_block_and_keeps_it_under_dynamic_levels(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=heterofl", "method.assignment=dynamic", *WIDTHS)
    grid = InProcessGrid(6)
    grid.contexts[grid.node_of_client[0]].node_config["model"] = "a"  # the rule said c: this device is the big one
    strategy.discover(grid, timeout=0)
    run(strategy, grid, rounds=2)
    sent = [
        (json.loads(m.content.config_records["config"]["spec"])["arch"], m.content.array_records["arrays"])
        for m in grid.sent
        if m.metadata.message_type == "train" and int(m.content.config_records["config"]["client-id"]) == 0
    ]
    assert len(sent) == 2 and all(arch == "a" for arch, _ in sent)
    full = strategy.model.schemas["a"].template
    assert all(tuple(arrays[k].shape) == tuple(full[k][0]) for _, arrays in sent for k in arrays.keys())
