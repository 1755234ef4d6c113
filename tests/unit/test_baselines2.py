"""The remaining baselines' defining behaviours: FedAMP, CFL, FedDyn, FedFomo, FedAP, MOON, pFedLA,
and the base's extra-array mechanism they use.

The math is tested on hand numbers; routing and state through the in-process LocalGrid
(4 clients, synthetic data, 1-3 rounds).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord
from sklearn.cluster import AgglomerativeClustering
from test_baselines import client, ctx, replied_keys  # noqa: F401  (client is a fixture)
from test_strategy_base import make, run, sent_keys
from torch import nn

import client_app.runtime as runtime
from client_app.roles import ROLES, SGDRole, build_role
from client_app.roles.base import EXTRA_PREFIX
from client_app.roles.fedap import bn_input_stats
from client_app.roles.feddyn import PREFIX as DYN_PREFIX
from client_app.roles.feddyn import feddyn_loss, linear_term, updated_state
from client_app.roles.fedfomo import fomo_combine, fomo_weights
from client_app.roles.moon import PREFIX as MOON_PREFIX
from client_app.roles.moon import contrastive_term, previous_model
from client_app.roles.proximal import proximal_loss, snapshot
from client_app.training import cross_entropy
from local_grid import LocalGrid, personal_state
from strategies import STRATEGIES
from strategies.aggregation import weighted_average
from strategies.cfl import bipartition
from strategies.checkpoint import decode, encode
from strategies.fedamp import attention_matrix
from strategies.fedap import bn_distance, fedap_weights
from strategies.fedavg import FedAvg
from strategies.feddyn import feddyn_server_update
from strategies.model_distance import gram_matrix
from strategies.pfedla import HyperNetwork, hypernet_step, personalize

NEW = ("fedamp", "cfl", "feddyn", "fedfomo", "fedap", "moon", "pfedla")


def trained_states(grid: LocalGrid) -> dict[int, dict[str, np.ndarray]]:
    """Each client's persisted state, by client id (clients that trained at least once)."""
    out = {}
    for node, c in grid.contexts.items():
        state = personal_state(c)
        if state is not None:
            out[int(c.node_config["partition-id"])] = state
    return out


def train_messages(grid: LocalGrid, server_round: int):
    return [m for m in grid.sent if m.metadata.message_type == "train" and int(m.content["config"]["server-round"]) == server_round]


# ----------------------------------------------------------------------------- extra arrays (base)
class EchoRole(SGDRole):
    """Sends back twice the extra array it received, untrained."""

    name = "echo"

    def fit(self, model, data, train_args, ctx):
        ctx.upload_extra["echo/x"] = 2 * ctx.received_extra["probe/x"]
        return {"train_loss": 0.0}


class Echo(FedAvg):
    role = "echo"

    def extra_downlink(self, client_id, server_round):
        return {"probe/x": np.full(3, float(client_id), np.float32)}

    def extra_uplink(self, client_id, server_round):
        return {"echo/x": ((3,), np.dtype(np.float32))}

    def aggregate(self, server_round, updates):
        self.echoed = {u.client_id: u.extra for u in updates}
        assert all(not any(k.startswith(EXTRA_PREFIX) for k in u.arrays) for u in updates)
        return super().aggregate(server_round, updates)


def test_extra_arrays_reach_the_role_come_back_validated_and_count_as_bytes(compose, tiny_overrides, monkeypatch):
    monkeypatch.setitem(ROLES, "echo", EchoRole)
    monkeypatch.setitem(STRATEGIES, "fedavg", Echo)
    _, strategy = make(compose, tiny_overrides, "method=fedavg", "fraction=1.0")
    grid = LocalGrid(4)

    def nan_extra(reply):  # a non-finite extra array is dropped like a non-finite weight
        arrays = reply.content.array_records["arrays"]
        arrays["extra/echo/x"] = Array(np.full(3, np.nan, np.float32))
        return reply

    def no_extra(reply):
        del reply.content.array_records["arrays"]["extra/echo/x"]
        return reply

    grid.tamper = {2: nan_extra, 3: no_extra}
    records = run(strategy, grid, rounds=1)
    assert {c: u["echo/x"].tolist() for c, u in strategy.echoed.items()} == {0: [0.0] * 3, 1: [2.0] * 3}
    reasons = {d["client"]: d["reason"] for d in records[0]["dropped"]}
    assert "NaN" in reasons[2] and "missing ['extra/echo/x']" in reasons[3]
    model_bytes = sum(v.nbytes for v in strategy.global_arrays.values())
    assert records[0]["bytes_down"] > 4 * (model_bytes + 12)  # the extras count
    assert all(keys == set(strategy.global_arrays) | {"extra/probe/x"} for keys in sent_keys(grid))


# ----------------------------------------------------------------------------- FedAMP
def test_fedamp_attention_rows_sum_to_one_and_closer_models_weigh_more():
    models = [{"w": np.array([0.0, 0.0])}, {"w": np.array([1.0, 0.0])}, {"w": np.array([3.0, 0.0])}]
    gram = gram_matrix(models, ["w"])
    xi = attention_matrix(gram, self_weight=0.5, sigma=2.0, kernel="distance")
    np.testing.assert_allclose(xi.sum(axis=1), 1.0)
    np.testing.assert_allclose(np.diag(xi), 0.5)
    # client 0: squared distances 1 and 9 -> 0.5 * softmax(-1/2, -9/2)
    e1, e9 = math.exp(-0.5), math.exp(-4.5)
    np.testing.assert_allclose(xi[0], [0.5, 0.5 * e1 / (e1 + e9), 0.5 * e9 / (e1 + e9)])
    assert xi[1, 0] > xi[1, 2] and xi[2, 1] > xi[2, 0]  # closer models get larger weights
    far = attention_matrix(1e6 * gram, self_weight=0.2, sigma=1.0)  # no underflow to an empty row
    np.testing.assert_allclose(far.sum(axis=1), 1.0) and np.testing.assert_allclose(far[0], [0.2, 0.8, 0.0])
    cos = attention_matrix(gram_matrix([{"w": np.array(v)} for v in ([1.0, 0.0], [1.0, 1.0], [-1.0, 0.0])], ["w"]), 0.5, 1.0, "cosine")
    s = np.exp([1 / math.sqrt(2), -1.0])
    np.testing.assert_allclose(cos[0], [0.5, *(0.5 * s / s.sum())])


def test_fedamp_client_loss_includes_the_pull_toward_the_cloud_model(client):
    model, data, args = client
    noise = torch.Generator().manual_seed(1)
    cloud = {k: v.detach() + 0.01 * torch.randn(v.shape, generator=noise) for k, v in model.named_parameters()}
    role_ctx = ctx()
    role_ctx.received_extra = {f"u/{k}": v for k, v in cloud.items()}
    role = build_role("fedamp", {"mu": 2.0})
    reference = role.reference(model, role_ctx)
    assert set(reference) == set(cloud) and all(torch.equal(reference[k], cloud[k]) for k in cloud)
    x, y = data.x_train[:8], data.y_train[:8]
    with torch.no_grad():  # lam/2 * ||w - u||^2 with lam = 2
        extra = float(proximal_loss(reference, 2.0)(model, x, y) - cross_entropy(model, x, y))
        assert extra == pytest.approx(sum(float(((p - cloud[k]) ** 2).sum()) for k, p in model.named_parameters()), rel=1e-4)
    moved = {}
    for lam in (0.0, 10.0):
        m, c = copy.deepcopy(model), ctx()
        c.received_extra = role_ctx.received_extra
        build_role("fedamp", {"mu": lam}).fit(m, data, args, c)
        moved[lam] = sum(float(((p.detach() - cloud[k]) ** 2).sum()) for k, p in m.named_parameters())
    assert moved[10.0] < 0.1 * moved[0.0]  # a large lam keeps w near u


def test_fedamp_sends_each_client_its_cloud_model_and_keeps_models_on_the_clients(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedamp", "fraction=1.0")
    grid = LocalGrid(4)
    run(strategy, grid, rounds=1)
    keys = set(strategy.global_arrays)
    assert all(k == {"extra/u/" + x for x in keys} for k in sent_keys(grid))  # only u_i travels down
    assert all(k == keys for k in replied_keys(grid)) and set(strategy.models) == {0, 1, 2, 3}
    states = trained_states(grid)
    for cid, w in strategy.models.items():  # the personal model stays on the client too
        assert all(np.array_equal(states[cid][k], w[k]) for k in keys)
    messages = list(strategy.configure_train(2, ArrayRecord(), ConfigRecord(), grid))
    k = "groups.fc1.0.weight"
    for m in messages:
        cid = strategy._inflight[m.metadata.dst_node_id]
        models, row = strategy.cloud_weights(cid)
        assert len(row) == 4 and row[0] == 0.5 and row.sum() == pytest.approx(1.0)
        expected = weighted_average(models, row, keys=[k])[k]
        np.testing.assert_allclose(m.content.array_records["arrays"]["extra/u/" + k].numpy(), expected, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- CFL
def test_bipartition_separates_a_hand_made_similarity_matrix_and_matches_the_reference():
    s = np.array([
        [1.0, 0.8, 0.7, -0.2, -0.4],
        [0.8, 1.0, 0.6, -0.1, -0.3],
        [0.7, 0.6, 1.0, 0.1, -0.5],
        [-0.2, -0.1, 0.1, 1.0, 0.9],
        [-0.4, -0.3, -0.5, 0.9, 1.0],
    ])
    assert bipartition(s) == ([0, 1, 2], [3, 4])
    assert bipartition(s[::-1, ::-1]) == ([0, 1], [2, 3, 4])  # item 0's cluster first
    rng = np.random.default_rng(0)  # the reference code's complete-linkage clustering (scikit-learn)
    for _ in range(40):
        v = rng.standard_normal((int(rng.integers(2, 10)), 4))
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        labels = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete").fit(1 - v @ v.T).labels_
        first = sorted(np.flatnonzero(labels == labels[0]).tolist())
        assert bipartition(v @ v.T)[0] == first


def test_cfl_splits_clients_with_swapped_labels_from_the_others(compose, tiny_overrides, monkeypatch):
    original = runtime.client_data

    def swapped(spec, cid, *args, **kwargs):  # clients 2 and 3 see y -> 9 - y
        data = original(spec, cid, *args, **kwargs)
        return dataclasses.replace(data, y_train=9 - data.y_train, y_test=9 - data.y_test) if cid >= 2 else data

    monkeypatch.setattr(runtime, "client_data", swapped)
    iid = [o for o in tiny_overrides if not o.startswith("partition.")] + ["partition=iid"]
    _, strategy = make(
        compose, iid, "method=cfl", "fraction=1.0", "local_epochs=2",
        "method.start_round=2", "method.eps1=100", "method.eps2=0",
    )
    grid = LocalGrid(4)
    records = run(strategy, grid, rounds=2)
    assert [r["clusters"] for r in records] == [[[0, 1, 2, 3]], [[0, 1], [2, 3]]]
    assert records[1]["splits"] == 1 and strategy.sim[0, 1] > max(strategy.sim[0, 2:].max(), strategy.sim[1, 2:].max())
    messages = list(strategy.configure_train(3, ArrayRecord(), ConfigRecord(), grid))
    k = "groups.classifier.weight"
    sent = {strategy._inflight[m.metadata.dst_node_id]: m.content.array_records["arrays"][k].numpy() for m in messages}
    assert np.array_equal(sent[0], sent[1]) and np.array_equal(sent[2], sent[3]) and not np.array_equal(sent[0], sent[2])
    np.testing.assert_array_equal(sent[2], strategy.cluster_models[1][k])


def test_cfl_does_not_split_before_its_thresholds_say_so(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=cfl", "fraction=1.0", "method.start_round=1")
    records = run(strategy, LocalGrid(4), rounds=1)  # eps2 = 1.6: one epoch moves far less
    assert records[0]["clusters"] == [[0, 1, 2, 3]] and records[0]["max_update_norm"] < 1.6


# ----------------------------------------------------------------------------- FedDyn
def test_feddyn_server_update_on_hand_numbers():
    g, h = {"w": np.array([1.0], np.float32)}, {"w": np.zeros(1)}
    g1, h1 = feddyn_server_update(g, [{"w": np.array([2.0], np.float32)}, {"w": np.array([4.0], np.float32)}], h, 0.1, 4)
    # h = 0 - 0.1/4 * ((2 - 1) + (4 - 1)) = -0.1 ; global = mean 3 - h / 0.1 = 4
    assert h1["w"].tolist() == pytest.approx([-0.1]) and g1["w"].tolist() == pytest.approx([4.0])
    assert g1["w"].dtype == np.float32
    g2, h2 = feddyn_server_update(g1, [{"w": np.array([5.0], np.float32)}], h1, 0.1, 4)
    # h = -0.1 - 0.1/4 * (5 - 4) = -0.125 ; global = 5 + 1.25
    assert h2["w"].tolist() == pytest.approx([-0.125]) and g2["w"].tolist() == pytest.approx([6.25])


def test_feddyn_client_loss_and_state_update_on_hand_numbers(client):
    layer = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0]]))
    ref, g = {"weight": torch.tensor([[0.0, 1.0]])}, {"weight": torch.tensor([[0.5, -1.0]])}
    assert float(linear_term(layer, g).detach()) == pytest.approx(0.5 - 2.0)
    x, y = torch.ones(1, 2), torch.zeros(1, dtype=torch.long)
    with torch.no_grad():  # CE - <g, w> + alpha/2 ||w - ref||^2 = CE + 1.5 + 0.05 * 2
        assert float(feddyn_loss(ref, g, 0.1)(layer, x, y)) == pytest.approx(float(cross_entropy(layer, x, y)) + 1.5 + 0.1)
    new = updated_state(g, {"weight": torch.tensor([[1.0, 2.0]])}, ref, 0.1)  # g - 0.1 (w - ref)
    assert torch.allclose(new["weight"], torch.tensor([[0.4, -1.1]]))
    # the role keeps g on the client: from 0, g = -alpha (w_trained - w_received)
    model, data, args = client
    received, role_ctx = snapshot(model), ctx()
    build_role("feddyn", {"alpha": 0.01}).fit(model, data, replace(args, epochs=1), role_ctx)
    assert set(role_ctx.extra_state) == {DYN_PREFIX + k for k in received}
    for k, p in model.named_parameters():
        assert torch.allclose(role_ctx.extra_state[DYN_PREFIX + k], -0.01 * (p.detach() - received[k]), atol=1e-7)


def test_feddyn_round_trip_keeps_g_on_the_clients_and_h_on_the_server(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=feddyn", "fraction=1.0")
    before = copy.deepcopy(strategy.global_arrays)
    grid = LocalGrid(4)
    records = run(strategy, grid, rounds=1)
    assert not records[0]["dropped"] and records[0]["h_norm"] > 0
    replies = [r for r in grid.replies if r.metadata.message_type == "train"]
    uploads = [{k: v.numpy() for k, v in r.content.array_records["arrays"].items()} for r in replies]
    expected, _ = feddyn_server_update(before, uploads, {k: np.zeros(v.shape) for k, v in before.items()}, 0.01, 4)
    assert all(np.allclose(strategy.global_arrays[k], expected[k], atol=1e-6) for k in expected)
    assert all(any(k.startswith("extra." + DYN_PREFIX) for k in s) for s in trained_states(grid).values())


# ----------------------------------------------------------------------------- FedFomo
def test_fedfomo_weights_and_combination_on_hand_numbers():
    raw, w = fomo_weights(1.0, [0.5, 1.5, 0.8], [2.0, 1.0, 0.4])
    np.testing.assert_allclose(raw, [0.25, -0.5, 0.5], rtol=1e-4)  # (L_own - L_n) / ||theta_n - own||
    np.testing.assert_allclose(w, [1 / 3, 0.0, 2 / 3], rtol=1e-4)  # negatives -> 0, normalized
    assert fomo_weights(1.0, [1.2], [1.0])[1].tolist() == [0.0]  # nobody helps: own model kept
    own = {"x": torch.tensor([0.0, 0.0])}
    others = [{"x": torch.tensor([3.0, 3.0])}, {"x": torch.tensor([-4.0, 0.0])}, {"x": torch.tensor([0.0, 6.0])}]
    assert fomo_combine(own, others, w)["x"].tolist() == pytest.approx([1.0, 5.0], rel=1e-4)  # own + sum w_n (theta_n - own)


def test_fedfomo_a_better_downloaded_model_gets_a_positive_weight_a_worse_one_zero(client):
    model, data, args = client
    better = copy.deepcopy(model)
    build_role("sgd", {}).fit(better, data, replace(args, epochs=5), ctx())
    worse = copy.deepcopy(model)
    with torch.no_grad():
        for p in worse.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.5)
    role_ctx = ctx()
    role_ctx.received_extra = {f"{cid}/{k}": v for cid, m in ((7, better), (9, worse)) for k, v in snapshot(m).items()}
    metrics = build_role("fedfomo", {"val_ratio": 0.2}).fit(model, data, replace(args, epochs=0), role_ctx)
    assert metrics["fomo_w_7"] > 0 > metrics["fomo_w_9"] and metrics["fomo_helpful"] == 1
    # weights [1, 0]: the new model is the better one (no training with 0 epochs)
    assert all(torch.allclose(p, dict(better.named_parameters())[k]) for k, p in model.named_parameters())


def test_fedfomo_downloads_other_clients_models_and_learns_affinities(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedfomo", "fraction=1.0", "method.m=2")
    grid = LocalGrid(4)
    records = run(strategy, grid, rounds=2)
    keys = set(strategy.global_arrays)
    assert all(not k for k in sent_keys(grid)[:4]) and records[0]["bytes_down"] == 0  # round 1: nothing stored yet
    for m in train_messages(grid, 2):
        cid = int(m.content["config"]["client-id"])
        names = {k.split("/")[1] for k in m.content.array_records["arrays"].keys()}
        assert len(names) == 2 and str(cid) not in names  # M = 2 others, never itself
        assert all(k.startswith("extra/") and k.split("/", 2)[2] in keys for k in m.content.array_records["arrays"].keys())
    assert np.count_nonzero(strategy.affinity) == 8 and np.all(np.diag(strategy.affinity) == 0)
    assert all(keys == k for k in replied_keys(grid))


# ----------------------------------------------------------------------------- FedAP
def test_fedap_weights_and_model_momentum_on_hand_numbers(compose, tiny_overrides):
    a = {"bn_mean/0": np.array([0.0, 0.0]), "bn_var/0": np.array([1.0, 1.0])}
    b = {"bn_mean/0": np.array([3.0, 4.0]), "bn_var/0": np.array([1.0, 1.0])}
    c = {"bn_mean/0": np.array([0.0, 0.0]), "bn_var/0": np.array([4.0, 1.0])}  # sqrt(var) differs by 1
    assert bn_distance(a, b) == pytest.approx(5.0) and bn_distance(a, c) == pytest.approx(1.0)
    two = {**a, "bn_mean/1": np.array([1.0]), "bn_var/1": np.array([1.0])}
    assert bn_distance(two, {**c, "bn_mean/1": np.array([0.0]), "bn_var/1": np.array([1.0])}) == pytest.approx(2.0)  # sum over layers
    np.testing.assert_allclose(fedap_weights([5.0, 1.0], 0.5), [0.5, 0.5 / 6, 2.5 / 6])  # 1/d shares of 1 - mu
    np.testing.assert_allclose(fedap_weights([0.0, 2.0, 0.0], 0.5), [0.5, 0.25, 0.0, 0.25])
    assert fedap_weights([], 0.5).tolist() == [1.0]
    _, strategy = make(compose, tiny_overrides, "method=fedap", "method.warmup=0")
    keys = strategy.travelling_keys(strategy.groups, 0, 1)
    strategy.stats = {0: a, 1: b, 2: c}
    strategy.models = {j: {k: np.full(strategy.template[k][0], v, np.float32) for k in keys} for j, v in ((0, 6.0), (1, 12.0), (2, 0.0))}
    down = strategy.downlink(0, 1)  # 0.5 * own + 1/12 * theta_1 + 5/12 * theta_2 = 3 + 1 + 0
    assert set(down) == set(keys) and not set(down) & set(strategy.bn_keys)
    assert all(np.allclose(v, 4.0) for v in down.values())
    assert strategy.weights(3) == {3: 1.0}  # no statistics yet: its own (warm-up) model


def test_fedap_role_measures_the_input_statistics_of_each_bn_layer(client):
    model, data, _ = client
    stats = bn_input_stats(model, data.x_train, torch.device("cpu"), batch_size=7)
    with torch.no_grad():
        h = model.groups.conv1[0](data.x_train).double()  # conv1's BN input
    assert set(stats) == {"bn_mean/0", "bn_var/0", "bn_mean/1", "bn_var/1"} and stats["bn_mean/1"].shape == (16,)
    assert torch.allclose(stats["bn_mean/0"].double(), h.mean(dim=(0, 2, 3)), atol=1e-5)
    assert torch.allclose(stats["bn_var/0"].double(), h.var(dim=(0, 2, 3), unbiased=False), atol=1e-5)


def test_fedap_warmup_then_statistics_once_then_bn_similarity_weights(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=fedap", "method.warmup=1", "fraction=1.0")
    grid = LocalGrid(4)
    records = run(strategy, grid, rounds=3)
    assert [r["phase"] for r in records] == ["warmup", "personal", "personal"]
    travelling = set(strategy.global_arrays) - set(strategy.bn_keys)
    assert all(k == travelling for k in sent_keys(grid))  # BN parameters never travel
    ups = replied_keys(grid)
    stats = {f"extra/bn_{s}/{i}" for i in range(2) for s in ("mean", "var")}
    assert [k == travelling for k in ups[:4]] == [True] * 4 and all(k == travelling | stats for k in ups[4:8])
    assert all(k == travelling for k in ups[8:])  # statistics are uploaded once
    assert set(strategy.stats) == {0, 1, 2, 3} and records[2]["clients_with_stats"] == 4
    w = strategy.weights(0)
    assert w[0] == 0.5 and sum(w.values()) == pytest.approx(1.0) and len(w) == 4


# ----------------------------------------------------------------------------- MOON
def test_moon_contrastive_term_on_hand_features():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    z_glob = torch.tensor([[2.0, 0.0], [0.0, 1.0]])  # cosine 1 with z
    z_prev = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])  # cosine 0 with z
    expected = -math.log(math.exp(2.0) / (math.exp(2.0) + 1.0))  # sims 1 and 0 over tau = 0.5
    assert float(contrastive_term(z, z_glob, z_prev, 0.5)) == pytest.approx(expected)
    assert float(contrastive_term(z, z_prev, z_glob, 0.5)) == pytest.approx(-math.log(1.0 / (1.0 + math.exp(2.0))))
    assert float(contrastive_term(z, z_glob, z_glob, 0.5)) == pytest.approx(math.log(2.0))


def test_moon_persists_the_previous_local_model_between_rounds(client):
    model, data, args = client
    role_ctx = ctx()
    assert all(torch.equal(a, b) for a, b in zip(previous_model(model, role_ctx).state_dict().values(), model.state_dict().values()))
    metrics = build_role("moon", {"mu": 1.0, "tau": 0.5}).fit(model, data, args, role_ctx)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    assert set(role_ctx.extra_state) == {MOON_PREFIX + k for k in trained} and math.isfinite(metrics["train_loss"])
    next_round = copy.deepcopy(model)
    with torch.no_grad():
        for p in next_round.parameters():
            p.zero_()  # a new global model arrives
    prev = previous_model(next_round, ctx(extra=role_ctx.extra_state))
    assert all(torch.equal(prev.state_dict()[k], trained[k]) for k in trained)
    assert not any(p.requires_grad for p in prev.parameters()) and not prev.training


def test_moon_round_trip_is_fedavg_with_the_previous_model_on_the_client(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=moon", "fraction=1.0")
    grid = LocalGrid(4)
    records = run(strategy, grid, rounds=1)
    assert not records[0]["dropped"] and all(k == set(strategy.global_arrays) for k in sent_keys(grid) + replied_keys(grid))
    assert all(any(k.startswith("extra." + MOON_PREFIX) for k in s) for s in trained_states(grid).values())


# ----------------------------------------------------------------------------- pFedLA
def test_pfedla_hypernetwork_rows_sum_to_one_and_its_update_approaches_the_trained_model():
    torch.manual_seed(0)
    hypernet = HyperNetwork(num_clients=3, num_layers=2, embedding_dim=4, hidden_dim=8)
    alpha = hypernet()
    assert alpha.shape == (2, 3) and torch.allclose(alpha.sum(dim=1), torch.ones(2)) and bool((alpha > 0).all())
    layer_keys = [["a"], ["b"]]
    models = [
        {"a": np.array([1.0, 0.0]), "b": np.array([0.0])},
        {"a": np.array([0.0, 1.0]), "b": np.array([1.0])},
        {"a": np.array([0.0, 0.0]), "b": np.array([4.0])},
    ]
    trained = {"a": np.array([0.9, 0.1]), "b": np.array([0.2])}  # close to client 0's model

    def gap() -> float:
        pers = personalize(models, hypernet().detach().numpy(), layer_keys)
        return float(sum(np.sum((pers[k] - trained[k]) ** 2) for k in trained))

    before, alpha0 = gap(), hypernet().detach()
    pers = hypernet_step(hypernet, models, trained, layer_keys, lr=0.05)
    assert np.allclose(pers["a"], alpha0[0].numpy() @ np.stack([m["a"] for m in models]), atol=1e-6)  # w~ it started from
    assert gap() < before
    alpha1 = hypernet().detach()
    assert alpha1[0, 0] > alpha0[0, 0] and alpha1[1, 2] < alpha0[1, 2]  # toward client 0, away from the far one


def test_pfedla_personalizes_layer_by_layer_and_updates_the_participants_hypernetworks(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, "method=pfedla", "fraction=1.0")
    grid = LocalGrid(4)
    records = run(strategy, grid, rounds=1)
    assert not records[0]["dropped"] and set(strategy.hypernets) == set(strategy.models) == {0, 1, 2, 3}
    for m in strategy.configure_train(2, ArrayRecord(), ConfigRecord(), grid):
        cid = strategy._inflight[m.metadata.dst_node_id]
        alpha = strategy.alpha(cid)
        assert alpha.shape == (5, 4) and np.allclose(alpha.sum(axis=1), 1.0)
        k = "groups.fc2.0.weight"  # fc2 is group 3
        expected = sum(alpha[3, j] * strategy.models[j][k].astype(np.float64) for j in range(4))
        np.testing.assert_allclose(m.content.array_records["arrays"][k].numpy(), expected, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- server state
@pytest.mark.parametrize("method", NEW)
def test_extra_state_is_plain_and_restores_the_server_state(compose, tiny_overrides, method):
    extra = {"fedap": ["method.warmup=1"], "cfl": ["method.start_round=1", "method.eps1=100", "method.eps2=0"]}.get(method, [])
    args = (compose, tiny_overrides, f"method={method}", "fraction=1.0", *extra)
    _, strategy = make(*args)
    grid = LocalGrid(4)
    run(strategy, grid, rounds=2)
    arrays: dict[str, np.ndarray] = {}
    encoded = encode(strategy.extra_state(), arrays)  # checkpointable: plain values and arrays only
    _, fresh = make(*args)
    fresh.global_arrays = copy.deepcopy(strategy.global_arrays)
    fresh.load_extra_state(decode(encoded, arrays))
    for cid in range(4):
        if method == "fedfomo":
            assert fresh.choose(cid) == strategy.choose(cid)
            continue
        down, again = strategy.downlink(cid, 3), fresh.downlink(cid, 3)
        extra_down, extra_again = strategy.extra_downlink(cid, 3), fresh.extra_downlink(cid, 3)
        assert set(down) == set(again) and all(np.array_equal(down[k], again[k]) for k in down)
        assert set(extra_down) == set(extra_again) and all(np.array_equal(extra_down[k], extra_again[k]) for k in extra_down)
