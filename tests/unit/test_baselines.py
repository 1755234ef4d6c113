"""The baselines' defining behaviours: FedProx, FedRep, FedBabu, FedBN, LG-FedAvg, pFedSim, Ditto.

Role behaviour is tested on the role functions directly; routing (what travels) through the
in-process LocalGrid (4 clients, synthetic data, 1-3 rounds).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from test_strategy_base import make, run, sent_keys
from torch import nn

from client_app.roles import RoleContext, build_role
from client_app.roles import fedrep as fedrep_role
from client_app.roles.ditto import PREFIX
from client_app.roles.proximal import proximal_loss, proximal_term, snapshot
from client_app.runtime import client_data, fresh_model
from client_app.training import TrainArgs, train
from local_grid import LocalGrid, personal_state
from models import buffer_keys
from server_app.config import client_spec
from strategies.aggregation import mixing_average
from strategies.fedbn import batchnorm_keys
from strategies.pfedsim import classifier_similarity, pfedsim_weights

HEAD = ["classifier"]
BODY = ["conv1", "conv2", "fc1", "fc2"]


# ----------------------------------------------------------------------------- helpers
@pytest.fixture
def client(compose, tiny_overrides):
    """(model, data, args) of client 0 of the tiny synthetic setup, as a ClientApp builds them."""
    spec = client_spec(compose(*tiny_overrides), "test-run")
    return fresh_model(spec), client_data(spec, 0), replace(TrainArgs(**spec["train"]), epochs=2)


def ctx(personal=(), extra=None) -> RoleContext:
    return RoleContext(torch.device("cpu"), torch.Generator().manual_seed(0), 1, list(personal), dict(extra or {}))


def params(model: nn.Module, groups) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in model.named_parameters() if k.split(".")[1] in groups}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def replied_keys(grid) -> list[set[str]]:
    return [set(r.content.array_records["arrays"].keys()) for r in grid.replies if r.metadata.message_type == "train"]



# ----------------------------------------------------------------------------- FedProx
def test_proximal_term_is_half_mu_squared_distance_on_a_hand_case():
    layer = nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0]]))
        layer.bias.copy_(torch.tensor([3.0]))
    ref = {"weight": torch.zeros(1, 2), "bias": torch.tensor([1.0])}
    term = proximal_term(layer, ref, mu=0.5)  # 0.5/2 * (1 + 4 + 4)
    assert float(term.detach()) == pytest.approx(2.25)
    term.backward()  # gradient mu * (w - ref)
    assert torch.allclose(layer.weight.grad, torch.tensor([[0.5, 1.0]])) and torch.allclose(layer.bias.grad, torch.tensor([1.0]))
    # the loss adds it to cross-entropy; mu = 0 is cross-entropy itself
    x, y = torch.ones(3, 2), torch.zeros(3, dtype=torch.long)
    base = lambda m, xb, yb: m(xb).sum()  # noqa: E731
    with torch.no_grad():
        assert float(proximal_loss(ref, 0.5, base)(layer, x, y)) == pytest.approx(float(layer(x).sum()) + 2.25)
    assert proximal_loss(ref, 0.0, base) is base


def test_fedprox_large_mu_keeps_local_weights_closer_to_the_global(client):
    model, data, args = client
    start = snapshot(model)
    moved = {}
    for mu in (0.0, 10.0):
        m = copy.deepcopy(model)
        build_role("proximal", {"mu": mu}).fit(m, data, args, ctx())
        moved[mu] = sum(float(((p.detach() - start[k]) ** 2).sum()) for k, p in m.named_parameters()) ** 0.5
    assert 0 < moved[10.0] < 0.8 * moved[0.0]


def test_fedprox_sends_mu_to_the_proximal_role(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedprox", "method.mu=0.01")
    spec = strategy._config(0, 1, "train")["spec"]
    assert '"role": "proximal"' in spec and '"mu": 0.01' in spec
    assert set(strategy.downlink(0, 1)) == set(strategy.global_arrays)


# ----------------------------------------------------------------------------- FedRep
def test_fedrep_trains_the_head_first_then_the_body(client, monkeypatch):
    model, data, args = client
    phases = []

    def recording_train(m, x, y, train_args, **kw):
        before_head, before_body = params(m, HEAD), params(m, BODY)
        loss = train(m, x, y, train_args, **kw)
        phases.append((train_args, same(before_head, params(m, HEAD)), same(before_body, params(m, BODY))))
        return loss

    monkeypatch.setattr(fedrep_role, "train", recording_train)
    metrics = build_role("fedrep", {"head": HEAD, "body_epochs": 1}).fit(model, data, replace(args, epochs=3), ctx(HEAD))
    (head_args, head_fixed_1, body_fixed_1), (body_args, head_fixed_2, body_fixed_2) = phases
    assert head_args.epochs == 2 and body_args.epochs == 1  # E - e_body, then e_body
    assert not head_fixed_1 and body_fixed_1  # head epochs: the body does not change
    assert head_fixed_2 and not body_fixed_2  # body epoch: the head does not change
    assert set(metrics) == {"head_loss", "body_loss", "train_loss"}


# ----------------------------------------------------------------------------- FedBabu
def test_fedbabu_role_never_trains_the_head_and_evaluates_a_fine_tuned_copy(client):
    model, data, args = client
    head0, body0 = params(model, HEAD), params(model, BODY)
    role = build_role("fedbabu", {"head": HEAD, "finetune_epochs": 1, "finetune_part": "all"})
    tuned = role.eval_model(model, data, args, ctx(HEAD))
    assert not same(params(tuned, HEAD), head0) and not same(params(tuned, BODY), body0)  # fine-tuned copy
    assert same(params(model, HEAD), head0) and same(params(model, BODY), body0)  # the model itself untouched
    role.fit(model, data, args, ctx(HEAD))
    assert same(params(model, HEAD), head0) and not same(params(model, BODY), body0)
    head_only = build_role("fedbabu", {"head": HEAD, "finetune_epochs": 1, "finetune_part": "head"})
    tuned = head_only.eval_model(model, data, args, ctx(HEAD))
    assert not same(params(tuned, HEAD), head0) and same(params(tuned, BODY), params(model, BODY))


def test_fedbabu_never_sends_the_head_and_test_before_uses_the_fine_tuned_model(compose, tiny_overrides):
    losses = {}
    for epochs in (0, 1):
        _, strategy = make(compose, tiny_overrides, "method=fedbabu", f"method.finetune_epochs={epochs}")
        initial_head = {k: strategy.global_arrays[k].copy() for k in strategy.keys(HEAD)}
        grid = LocalGrid(4)
        records = run(strategy, grid, rounds=2)
        body = set(strategy.keys(BODY))
        assert all(keys == body for keys in sent_keys(grid) + replied_keys(grid))
        for c in grid.contexts.values():  # the persisted head is still the initial one
            state = personal_state(c)
            if state is not None:
                assert all(np.array_equal(state[k], v) for k, v in initial_head.items())
        losses[epochs] = records[0]["test_before_loss"]
    assert losses[1] != pytest.approx(losses[0])  # same clients and models: only the fine-tuning differs


# ----------------------------------------------------------------------------- FedBN
def test_fedbn_bn_parameters_and_buffers_never_travel(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedbn")
    model = fresh_model(strategy.client_spec)
    bn = set(batchnorm_keys(model))
    assert bn == {f"groups.conv{i}.1.{p}" for i in (1, 2) for p in ("weight", "bias")}
    grid = LocalGrid(4)
    records = run(strategy, grid, rounds=2)
    expected = set(strategy.global_arrays) - bn
    travelled = sent_keys(grid) + replied_keys(grid)
    assert travelled and all(keys == expected for keys in travelled)  # conv weights go, BN stays
    assert not any(k in bn or k in buffer_keys(model) for keys in travelled for k in keys)
    assert all(not r["dropped"] for r in records)
    trained = [s for c in grid.contexts.values() if (s := personal_state(c)) is not None]
    assert len(trained) >= 2 and all(bn <= set(s.keys()) for s in trained)  # persisted on the client
    gammas = [s["groups.conv1.1.weight"] for s in trained]
    assert not np.array_equal(gammas[0], gammas[1])  # and personal


# ----------------------------------------------------------------------------- LG-FedAvg
def test_lgfedavg_lower_groups_stay_upper_groups_travel(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=lgfedavg")
    assert strategy.local_groups == ["conv1", "conv2"]
    grid = LocalGrid(4)
    records = run(strategy, grid, rounds=2)
    upper = set(strategy.keys(["fc1", "fc2", "classifier"]))
    assert all(keys == upper for keys in sent_keys(grid) + replied_keys(grid))
    assert all(r["groups_down"] == r["groups_up"] == ["fc1", "fc2", "classifier"] for r in records)
    states = [s for c in grid.contexts.values() if (s := personal_state(c)) is not None]
    assert states and all(set(strategy.keys(["conv1", "conv2"])) <= set(s.keys()) for s in states)
    _, custom = make(compose, tiny_overrides, "method=lgfedavg", "method.local_groups=[conv1]")
    assert custom.personal_groups(0, 1) == ["conv1"]


# ----------------------------------------------------------------------------- pFedSim
def test_pfedsim_similarity_and_weights_by_hand():
    eye = np.eye(2, dtype=np.float32)
    classifiers = [
        {"w": eye, "b": np.zeros(2, np.float32)},
        {"w": np.array([[2.0, 0.0], [3.0, 0.0]], np.float32), "b": np.ones(2, np.float32)},  # row cosines 1, 0
        {"w": -eye, "b": np.zeros(2, np.float32)},  # row cosines with client 0: -1, -1
    ]
    s = classifier_similarity(classifiers, ["w", "b"])  # the bias is left out
    np.testing.assert_allclose(s, [[1, 0.5, 0], [0.5, 1, 0], [0, 0, 1]], atol=1e-6)
    np.testing.assert_allclose(pfedsim_weights(s[0], 0, "linear"), [2 / 3, 1 / 3, 0])
    expected = np.array([-np.log(1e-4), np.log(2), 0])  # -log(1 - S), S_ii = 0.9999
    np.testing.assert_allclose(pfedsim_weights(s[0], 0, "pfedsim"), expected / expected.sum())
    np.testing.assert_allclose(pfedsim_weights(np.ones(3), 1, "pfedsim"), [1 / 3] * 3)  # S = 1 stays finite
    bodies = [{"x": np.array([v], np.float32)} for v in (0.0, 3.0, 6.0)]
    mixed = mixing_average(bodies, np.stack([pfedsim_weights(s[i], i, "linear") for i in range(3)]))
    assert [float(m["x"][0]) for m in mixed] == pytest.approx([1.0, 2.0, 6.0])


def test_pfedsim_warmup_sends_everything_then_classifier_stays_and_bodies_differ(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=pfedsim", "method.warmup=1", "fraction=1.0")
    grid = LocalGrid(4)
    records = run(strategy, grid, rounds=2)
    everything, head, body = set(strategy.global_arrays), set(strategy.keys(HEAD)), set(strategy.keys(BODY))
    down = sent_keys(grid)
    assert [r["phase"] for r in records] == ["warmup", "personal"]
    assert all(keys == everything for keys in down[:4])  # round 1 (warm-up): FedAvg of everything
    assert all(keys == everything for keys in down[4:])  # round 2: body + the warm-up classifier, once
    assert all(keys == everything for keys in replied_keys(grid))  # classifiers go up, for S only
    assert np.all(strategy.sim[~np.eye(4, dtype=bool)] > 0) and strategy.head_seen == {0, 1, 2, 3}
    messages = list(strategy.configure_train(3, ArrayRecord(), ConfigRecord(), grid))
    bodies = {}
    for m in messages:
        arrays = m.content.array_records["arrays"]
        assert set(arrays.keys()) == body  # the classifier is never sent again
        cid = strategy._inflight[m.metadata.dst_node_id]
        bodies[cid] = {k: arrays[k].numpy() for k in body}
        weights = strategy.body_weights(cid)
        assert len(weights) == 4 and weights[cid] == max(weights.values())
        expected = sum(w * strategy.bodies[j]["groups.fc1.0.weight"].astype(np.float64) for j, w in weights.items())
        np.testing.assert_allclose(bodies[cid]["groups.fc1.0.weight"], expected, rtol=1e-5, atol=1e-6)
    assert len({tuple(strategy.sim[c].round(6)) for c in bodies}) == 4  # rows of S differ...
    k = "groups.fc1.0.weight"
    assert all(not np.array_equal(bodies[a][k], bodies[b][k]) for a in bodies for b in bodies if a < b)  # ...so do bodies


# ----------------------------------------------------------------------------- Ditto
def test_ditto_keeps_a_personal_model_and_evaluates_it(client):
    model, data, args = client
    received = copy.deepcopy(model)
    role_ctx = ctx()
    role = build_role("ditto", {"lam": 0.1, "personal_epochs": 1})
    assert role.eval_model(model, data, args, role_ctx) is not model  # first contact: a copy of the global
    metrics = role.fit(model, data, args, role_ctx)
    assert set(metrics) == {"train_loss", "personal_loss"}
    personal = {k[len(PREFIX):]: v for k, v in role_ctx.extra_state.items()}
    assert set(personal) == set(model.state_dict())  # parameters and BN buffers
    assert not same(params(model, BODY + HEAD), {k: personal[k] for k in params(model, BODY + HEAD)})  # v != w
    assert not same(params(model, BODY + HEAD), params(received, BODY + HEAD))  # w was trained and is uploaded
    after = role.trained_model(model, role_ctx)  # test_after: v
    assert same(params(after, BODY + HEAD), {k: personal[k] for k in params(after, BODY + HEAD)})
    # next round: a new global arrives; test_before evaluates the persisted v, not it
    next_role, next_ctx = build_role("ditto", {"lam": 0.1}), ctx(extra=role_ctx.extra_state)
    evaluated = next_role.eval_model(received, data, args, next_ctx)
    assert all(torch.equal(v, personal[k]) for k, v in evaluated.state_dict().items())


def test_ditto_round_trip_persists_the_personal_model(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=ditto", "fraction=1.0")
    grid = LocalGrid(4)
    records = run(strategy, grid, rounds=1)
    assert not records[0]["dropped"] and all(k == set(strategy.global_arrays) for k in replied_keys(grid))
    for c in grid.contexts.values():
        v = personal_state(c)["extra.ditto.groups.fc1.0.weight"]
        assert not np.array_equal(v, strategy.global_arrays["groups.fc1.0.weight"])  # personal != global
    assert strategy.final_metrics["final_clients"] == 4
