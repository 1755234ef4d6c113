"""FedCPMD: the four distances, the knowledge representation, votes and clusters, phase 1's
extension, and phase 2's clusters that never exchange a tensor (FedCPMD paper, algorithm)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from method_helpers import role_args_of
from scipy import integrate
from scipy.stats import norm
from test_strategy_base import make, run

from pflower.client_app.roles.fedcpmd import FedCPMDArgs, FedCPMDRole
from pflower.client_app.roles.layer_stats import (
    GaussianFit,
    LayerScorer,
    ScoreRule,
    batch_vote,
    bhattacharyya_coefficient,
    distance,
    label_fit,
    layer_score,
    tensor_moments,
)
from pflower.protocol.options import OptionError
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.fedcpmd import cluster_sample_size, personal_layer_of
from pflower.strategies.shared.clustering import groups_by_label

P, Q = GaussianFit(0.3, 0.2), GaussianFit(0.5, 0.1)  # a hand-worked example


def numeric(a: GaussianFit, b: GaussianFit, f) -> float:
    lo, hi = min(a.mu, b.mu) - 12 * max(a.sigma, b.sigma), max(a.mu, b.mu) + 12 * max(a.sigma, b.sigma)
    return integrate.quad(lambda t: f(norm.pdf(t, a.mu, a.sigma), norm.pdf(t, b.mu, b.sigma)), lo, hi, limit=400)[0]


# ----------------------------------------------------------------------------- distances
def test_the_spec_worked_example():
    assert bhattacharyya_coefficient(P, Q) == pytest.approx(0.73230, abs=5e-5)
    assert distance(P, Q, "bhattacharyya") == pytest.approx(0.31157, abs=5e-5)
    assert distance(P, Q, "hellinger") ** 2 == pytest.approx(1 - 0.73230, abs=5e-5)
    assert distance(P, Q, "w2") == pytest.approx(math.hypot(0.2, 0.1))


@pytest.mark.parametrize(
    "a, b", [(P, Q), (GaussianFit(0.1, 0.05), GaussianFit(0.12, 0.3)), (GaussianFit(0, 1), GaussianFit(3, 1))]
)
def test_distances_against_numerical_integration(a, b):
    def kl_half(p, q):  # p log(p / m), m = (p + q) / 2, guarded where p = 0
        m = 0.5 * (p + q)
        return p * math.log(p / m) if p > 0 else 0.0

    js = 0.5 * numeric(a, b, kl_half) + 0.5 * numeric(b, a, kl_half)
    bc = numeric(a, b, lambda p, q: math.sqrt(p * q))
    assert distance(a, b, "js") == pytest.approx(js, abs=2e-4)
    assert bhattacharyya_coefficient(a, b) == pytest.approx(bc, abs=1e-6)
    assert distance(a, b, "bhattacharyya") == pytest.approx(-math.log(bc), abs=1e-5)
    assert distance(a, b, "hellinger") == pytest.approx(math.sqrt(1 - bc), abs=1e-5)


@pytest.mark.parametrize("name", ["js", "w2", "hellinger", "bhattacharyya"])
def test_distance_axioms(name):
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = GaussianFit(*rng.uniform([0, 0.01], [1, 0.5])), GaussianFit(*rng.uniform([0, 0.01], [1, 0.5]))
        assert distance(a, a, name) == pytest.approx(0.0, abs=1e-9)
        assert distance(a, b, name) == pytest.approx(distance(b, a, name), abs=1e-9) and distance(a, b, name) >= 0
    far = (GaussianFit(0.0, 1e-3), GaussianFit(1.0, 1e-3))
    assert distance(*far, "js") == pytest.approx(math.log(2), abs=1e-6)  # disjoint supports: ln 2, never more
    assert distance(*far, "hellinger") == pytest.approx(1.0)


# ----------------------------------------------------------------------------- the knowledge representation
def test_labels_are_fitted_as_y_over_c_minus_1_with_a_sigma_floor():
    y = torch.tensor([0, 9, 9, 9])
    fit = label_fit(tensor_moments([y])[0], "scaled", 10, 1e-3)
    assert fit.mu == pytest.approx(27 / 4 / 9) and fit.sigma == pytest.approx(float(y.double().std()) / 9)
    one_class = label_fit(tensor_moments([torch.full((8,), 3)])[0], "scaled", 10, 1e-3)
    assert one_class == GaussianFit(3 / 9, 1e-3, False)  # not NaN, not "constant": a narrow Gaussian at 1/3


def test_single_class_batches_give_finite_scores_and_a_real_vote_for_every_distance():
    torch.manual_seed(0)
    x = torch.randn(16, 1, 8, 8)
    outs = [torch.randn(16, 20), torch.relu(torch.randn(16, 12)), torch.relu(torch.randn(16, 8)), torch.randn(16, 10)]
    for name in ("js", "w2", "hellinger", "bhattacharyya"):
        for selector in ("eq7", "eq6", "fedcmd_code"):
            rule = ScoreRule(selector, name, "scaled", 1e-3, "fc2", 10)
            scorer = LayerScorer(["conv", "fc1", "fc2", "classifier"], ["fc1", "fc2", "classifier"], rule=rule)
            scorer.observe(x, torch.full((16,), 4), outs)  # one class: the official code's NaN case
            m = scorer.metrics()
            assert all(math.isfinite(m[f"s_mean_{c}"]) for c in ("fc1", "fc2", "classifier")) and m["vote"] in (0, 1, 2)


def test_eq7_and_eq6_on_hand_built_fits():
    out, prev, x, y = GaussianFit(0.5, 0.2), GaussianFit(0.4, 0.1), GaussianFit(0.3, 0.3), GaussianFit(0.6, 0.1)
    d = lambda a, b: distance(a, b, "hellinger")  # noqa: E731
    eq7 = abs((d(out, y) - d(out, x)) - (d(prev, y) - d(prev, x)))
    assert layer_score(out, prev, x, y, "eq7", "hellinger") == pytest.approx(eq7)
    eq6 = d(GaussianFit(0.1, math.hypot(0.2, 0.1)), GaussianFit(0.3, math.hypot(0.1, 0.3)))
    assert layer_score(out, prev, x, y, "eq6", "hellinger") == pytest.approx(eq6)


def test_ties_at_the_minimum_go_to_fc2_under_fedcpmds_prior():
    assert batch_vote([0.2, 0.1, 0.1], prior=1) == 1 and batch_vote([0.1, 0.1, 0.1], prior=1) == 1
    assert batch_vote([0.1, 0.2, 0.1], prior=1) == 0  # fc2 not at the minimum: the earliest
    assert batch_vote([0.1, 0.1, 0.3]) == 0  # FedCMD: no prior


def test_the_role_votes_during_training_and_a_probe_does_not_train(client):
    model, data, args = client
    ctx_ = __import__("method_helpers").ctx
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe = FedCPMDRole(role_args_of("fedcpmd", phase=0, candidates=["fc1", "fc2", "classifier"]))
    metrics = probe.fit(model, data, args, ctx_())
    assert metrics["probe"] == 1.0 and metrics["vote"] in (0.0, 1.0, 2.0) and metrics["scored_batches"] > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # no update, not even BN stats
    voted = FedCPMDRole(
        role_args_of("fedcpmd", phase=1, candidates=["fc1", "fc2", "classifier"], distance="bhattacharyya")
    ).fit(model, data, args, ctx_())
    assert (
        voted["vote"] in (0.0, 1.0, 2.0)
        and sum(voted[f"votes_{c}"] for c in ("fc1", "fc2", "classifier")) == voted["scored_batches"]
    )
    with pytest.raises(OptionError, match="distance"):
        FedCPMDArgs(**role_args_of("fedcpmd", phase=1, candidates=["fc1"], distance="kl"))


# ----------------------------------------------------------------------------- votes and clusters
def test_a_clients_layer_is_its_most_frequent_vote_and_ties_go_to_the_most_recent():
    assert personal_layer_of([(1, "fc1"), (3, "fc2"), (5, "fc1")]) == "fc1"
    assert personal_layer_of([(1, "fc2"), (4, "fc1")]) == "fc1"  # tied: the later vote
    assert personal_layer_of([(7, "classifier"), (2, "fc1")]) == "classifier"
    assert personal_layer_of([]) is None
    assert groups_by_label({3: "fc2", 0: "fc1", 5: "fc1", 9: "fc2", 1: "classifier"}) == [[0, 5], [1], [3, 9]]


def test_cluster_sample_sizes():
    assert [cluster_sample_size(n, 0.1) for n in (1, 5, 6, 40, 60)] == [1, 5, 5, 5, 6]  # the reference code
    assert [cluster_sample_size(n, 0.1, "paper") for n in (1, 6, 40, 60)] == [1, 1, 4, 6]


# ----------------------------------------------------------------------------- the strategy
FAST = [
    "method=fedcpmd",
    "method.kp=2",
    "method.k_extra=0",
    "num_clients=6",
    "fraction=0.5",
    "rounds=5",
    "dataset.options.num_samples=900",
]


def test_phase_one_is_fedper_with_votes_and_is_extended_until_every_client_voted(compose, tiny_overrides, caplog):
    _, strategy = make(compose, tiny_overrides, *FAST[:2], "method.k_extra=3", *FAST[3:])
    grid = InProcessGrid(6)
    strategy.discover(grid)
    assert all(strategy._continue_phase1(r) for r in (1, 2))
    strategy.votes = {c: [(1, "fc1")] for c in range(5)}  # client 5 has not voted yet
    assert strategy._continue_phase1(4) and "phase 1 extended past Kp=2" in caplog.text
    assert not strategy._continue_phase1(6)  # past kp + k_extra: the rest is probed
    strategy.votes[5] = [(3, "fc2")]
    assert not strategy._continue_phase1(3)


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_two_phases_probe_the_unvoted_and_clusters_never_exchange_a_tensor(compose, tiny_overrides):
    _, strategy = make(compose, tiny_overrides, *FAST)
    grid = InProcessGrid(6)
    records = run(strategy, grid, rounds=2)
    assert [r["phase"] for r in records] == [1, 1]
    classifier = set(strategy.model.keys(["classifier"]))
    sent = [
        (json.loads(m.content.config_records["config"]["spec"]), set(m.content.array_records["arrays"].keys()))
        for m in grid.sent
        if m.metadata.message_type == "train"
    ]
    assert all(s["personal"] == ["classifier"] and not keys & classifier for s, keys in sent)  # FedPer in phase 1
    # two groups of votes whatever the scores said: clients 0-2 chose fc1, 3-4 fc2; client 5 never voted
    strategy.votes = {c: [(1, "fc1" if c < 3 else "fc2")] for c in range(5)}
    strategy.start(grid, num_rounds=5)
    assert strategy.phase1_end == 2 and strategy.probed == [5]  # k_extra=0: probed at its first phase-2 contact
    members = strategy.clusters.members
    assert strategy.cluster_layers == ["fc1", "fc2"] and {0, 1, 2} <= set(members[0]) and {3, 4} <= set(members[1])
    assert 5 in members[strategy.cluster_layers.index(strategy.layer_of[5])]
    phase2 = [r for r in strategy.run.history if r["phase"] == 2]
    assert phase2 and all(r["num_clusters"] == 2 for r in phase2)
    # what each client received in phase 2 is its stored body or its own cluster's body, never its layer
    for msg in grid.sent:
        if msg.metadata.message_type != "train":
            continue
        cfg = msg.content.config_records["config"]
        rnd, cid = int(cfg["server-round"]), int(cfg["client-id"])
        spec = json.loads(cfg["spec"])
        if rnd < 3 or spec["role_args"]["phase"] == 0:
            continue
        layer = strategy.layer_of[cid]
        keys = set(msg.content.array_records["arrays"].keys())
        assert spec["personal"] == [layer] and keys == set(
            strategy.model.keys([g for g in strategy.model.groups if g != layer])
        )
    # the cluster bodies are FedAvgs of their own members' uploads only
    last = max(r["round"] for r in phase2)
    replies = {
        int(r.content.metric_records["metrics"]["client-id"]): r
        for r in grid.replies
        if r.metadata.message_type == "train" and not r.has_error()
    }
    ups = {c: r for c, r in replies.items() if c in strategy.run.history[-1]["clients"]}
    for c, layer in enumerate(strategy.cluster_layers):
        mine = [u for cid, u in ups.items() if strategy.clusters.of(cid) == c]
        if not mine:
            continue
        key = strategy.model.keys(["conv1"])[0]
        n = [u.content.metric_records["metrics"]["num-examples"] for u in mine]
        expected = sum(
            w * u.content.array_records["arrays"][key].numpy().astype(np.float64) for w, u in zip(n, mine)
        ) / sum(n)
        np.testing.assert_allclose(strategy.clusters.models[c][key], expected, rtol=1e-5)
    assert last == 5 and len(strategy.run.history[-1]["cluster_acc"]) == 2


def test_a_clients_own_layer_keeps_what_it_trained(compose, tiny_overrides, monkeypatch):
    """C3: the layer that turns personal at the switch starts phase 2 from the client's own last
    trained value (whole-model persistence), not from the seeded or the global one."""
    _, strategy = make(compose, tiny_overrides, *FAST[:3], "num_clients=4", "fraction=1.0", "rounds=3")
    grid = InProcessGrid(4)
    run(strategy, grid, rounds=2)
    from pflower.simulation.inprocess import personal_state

    trained = {c: personal_state(grid.contexts[grid.node_of_client[c]]) for c in range(4)}
    strategy.votes = {c: [(1, "fc1")] for c in range(4)}
    seen = {}
    original = FedCPMDRole.fit

    def spy(self, model, data, args, ctx):
        if ctx.server_round == 3:
            seen[data.client_id] = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
        return original(self, model, data, args, ctx)

    monkeypatch.setattr(FedCPMDRole, "fit", spy)
    strategy.start(grid, num_rounds=3)
    assert sorted(seen) == [0, 1, 2, 3]
    for c, state in seen.items():
        for k in strategy.model.keys(["fc1"]):
            np.testing.assert_array_equal(state[k], trained[c][k])
            assert not np.array_equal(state[k], strategy.model.global_arrays[k])


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_only_cluster_and_only_decoupling(compose, tiny_overrides):
    for ablation in ("only_cluster", "only_decoupling"):
        _, strategy = make(compose, tiny_overrides, *FAST, f"method.ablation={ablation}")
        records = run(strategy, InProcessGrid(6), rounds=4)
        assert records[-1]["phase"] == 2 and records[-1]["clients"]
        if ablation == "only_cluster":
            assert strategy.personal_groups(0, 4) == [] and strategy.clusters is not None
        else:
            assert strategy.clusters is None and strategy.personal_groups(0, 4) == [strategy.layer_of[0]]


def test_fedcpmd_refuses_a_run_too_short_for_phase_two(compose, tiny_overrides):
    from pflower.server_app.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match="no phase-2 round"):
        make(compose, tiny_overrides, "method=fedcpmd", "rounds=3")


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_two_groups_that_prefer_different_layers_form_two_clusters_with_the_right_members(compose, tmp_path):
    """Clients holding digits 0-1 vote fc2, clients holding 8-9 vote fc1 (the knowledge
    representation reads the label distribution); each node brings its own directory."""
    from pflower.federated_data import DataSpec, load_client_data
    from pflower.federated_data.local import write_local_dir

    spec = DataSpec(dataset="digits", partitioner="iid", num_clients=1, test_fraction=0.2, min_size=10)
    data = load_client_data(spec, 0)
    images = data.x_train  # normalized floats: mapped back into [0, 1] below
    lo, hi = float(images.min()), float(images.max())
    unit = ((images - lo) / (hi - lo)).numpy().astype(np.float32)
    labels = data.y_train.numpy()
    rng = np.random.default_rng(0)
    for cid in range(6):
        classes = (0, 1) if cid < 3 else (8, 9)
        idx = rng.permutation(np.flatnonzero(np.isin(labels, classes)))[:90]
        write_local_dir(
            tmp_path / f"c{cid}",
            (unit[idx[:60]], labels[idx[:60]]),
            (unit[idx[60:]], labels[idx[60:]]),
            name="digits",
            num_classes=10,
            client_id=cid,
        )
    cfg = compose(
        "method=fedcpmd",
        "dataset=local",
        "num_clients=6",
        "fraction=1.0",
        "rounds=4",
        "local_epochs=2",
        "method.kp=3",
        "method.k_extra=0",
        "final_eval=false",
    )
    from pflower.server_app.runner import build

    strategy = build(cfg, run_token="t")
    grid = InProcessGrid(6)
    for cid in range(6):
        grid.contexts[grid.node_of_client[cid]].node_config["data-dir"] = str(tmp_path / f"c{cid}")
    run(strategy, grid, rounds=4)
    assert strategy.clusters.members == [[0, 1, 2], [3, 4, 5]]
    assert strategy.cluster_layers == ["fc2", "fc1"]
    assert strategy.run.history[-1]["num_clusters"] == 2 and strategy.probed == []
