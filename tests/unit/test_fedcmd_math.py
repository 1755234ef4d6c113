"""FedCMD's math without Flower: W2, Gaussian fits, layer scores, vote rules, Eq. 7-8."""

import math

import numpy as np
import pytest
import torch
from method_helpers import role_args_of
from scipy.stats import norm

from pflower.client_app.roles import fedcmd as role
from pflower.client_app.roles.layer_stats import (
    GaussianFit,
    LayerScorer,
    Moments,
    batch_vote,
    candidate_scores,
    client_vote,
    fit_tensor,
    gaussian_fit,
    layer_score,
    tensor_moments,
    w2,
)
from pflower.client_app.training import TrainArgs
from pflower.models import build_model
from pflower.strategies.fedcmd import FedCMDState, default_candidates
from pflower.strategies.fedcmd_math import (
    eq7_weights,
    personal_layer_index,
    personalized_posts,
    round_winner,
    similarity_matrix,
)


# ----------------------------------------------------------------------------- W2
def numerical_w2(a: GaussianFit, b: GaussianFit, n: int = 400_000) -> float:
    """sqrt(int_0^1 (F_a^-1(q) - F_b^-1(q))^2 dq) on a midpoint grid of quantiles."""
    q = (np.arange(n) + 0.5) / n
    diff = norm.ppf(q, a.mu, a.sigma) - norm.ppf(q, b.mu, b.sigma)
    return float(np.sqrt(np.mean(diff**2)))


def test_w2_closed_form_values():
    assert w2(GaussianFit(0.3, 0.2), GaussianFit(0.3, 0.2)) == 0.0
    assert w2(GaussianFit(0, 1), GaussianFit(3, 1)) == pytest.approx(3.0)
    assert w2(GaussianFit(0, 1), GaussianFit(0, 2)) == pytest.approx(1.0)  # N(0,1) vs N(0,4)
    assert w2(GaussianFit(0, 1), GaussianFit(3, 5)) == pytest.approx(5.0)  # sqrt(3^2 + 4^2)


@pytest.mark.parametrize("a,b", [((0, 1), (3, 1)), ((0, 1), (0, 2)), ((0.2, 0.1), (0.7, 0.35)), ((1.5, 0.5), (-1, 2))])
def test_w2_matches_the_quantile_integral(a, b):
    fa, fb = GaussianFit(*a), GaussianFit(*b)
    assert w2(fa, fb) == pytest.approx(numerical_w2(fa, fb), rel=2e-3)


def test_w2_symmetric_non_negative_and_mean_only_ignores_sigma():
    rng = np.random.default_rng(0)
    for _ in range(50):
        a = GaussianFit(rng.uniform(-2, 2), rng.uniform(0, 2))
        b = GaussianFit(rng.uniform(-2, 2), rng.uniform(0, 2))
        for mode in ("gaussian", "mean_only"):
            assert w2(a, b, mode) == w2(b, a, mode) >= 0.0
        assert w2(a, b, "mean_only") == pytest.approx(abs(a.mu - b.mu))
        assert w2(a, b, "mean_only") <= w2(a, b, "gaussian") + 1e-12
    assert w2(GaussianFit(0, 1), GaussianFit(0, 9), "mean_only") == 0.0
    with pytest.raises(ValueError, match="w2_mode"):
        w2(GaussianFit(0, 1), GaussianFit(0, 1), "w1")


def test_w2_with_a_constant_tensor_is_zero():
    const = GaussianFit(0.0, 0.0, True)
    assert w2(const, GaussianFit(0.9, 0.3)) == 0.0 == w2(GaussianFit(0.9, 0.3), const, "mean_only")


# ----------------------------------------------------------------------------- Gaussian fit
def test_fit_is_minmax_normalised_mean_and_unbiased_std():
    u = torch.tensor([[0.0, 1.0], [2.0, 7.0]])
    normed = (u - 0.0) / 7.0
    fit = fit_tensor(u)
    assert not fit.constant
    assert fit.mu == pytest.approx(float(normed.mean()))
    assert fit.sigma == pytest.approx(float(normed.std()))  # torch.std: unbiased, as the official code


def test_fit_is_invariant_to_affine_rescaling():
    u = torch.randn(32, 84, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    a, b = fit_tensor(u), fit_tensor(17.5 * u - 3.25)
    assert a.mu == pytest.approx(b.mu, abs=1e-12) and a.sigma == pytest.approx(b.sigma, abs=1e-12)


def test_score_is_invariant_to_affine_rescaling_of_a_layer_output():
    g = torch.Generator().manual_seed(2)
    x, y = torch.rand(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)
    outs = [torch.randn(16, n, generator=g, dtype=torch.float64) for n in (64, 32, 24, 10)]
    scaled = [outs[0], 4.0 * outs[1] + 2.0, outs[2], outs[3]]
    names, cands = ["conv", "fc1", "fc2", "classifier"], ["fc1", "fc2", "classifier"]
    a, b = LayerScorer(names, cands), LayerScorer(names, cands)
    a.observe(x, y, outs)
    b.observe(x, y, scaled)
    ma, mb = a.metrics(), b.metrics()
    for c in cands:
        assert ma[f"s_mean_{c}"] == pytest.approx(mb[f"s_mean_{c}"], abs=1e-12)


def test_constant_tensors_and_one_class_batches_give_finite_scores():
    assert fit_tensor(torch.full((32,), 3)) == GaussianFit(0.0, 0.0, True)  # a batch of one class
    assert fit_tensor(torch.zeros(32, 84)).constant  # e.g. all-ReLU-dead activations
    assert fit_tensor(torch.tensor([5.0])).constant
    g = torch.Generator().manual_seed(3)
    scorer = LayerScorer(["conv", "fc1", "fc2", "classifier"], ["fc1", "fc2", "classifier"])
    scorer.observe(
        torch.rand(8, 1, 4, 4, generator=g),
        torch.full((8,), 3),
        [torch.rand(8, 5, generator=g), torch.zeros(8, 4), torch.rand(8, 3, generator=g), torch.ones(8, 2)],
    )
    m = scorer.metrics()
    assert all(math.isfinite(v) for v in m.values()) and 0 <= m["vote"] <= 2


def test_merged_moments_equal_the_moments_of_the_whole_tensor():
    g = torch.Generator().manual_seed(4)
    parts = [torch.randn(n, 7, generator=g) * 3 + 1 for n in (5, 1, 12)]
    merged = Moments()
    for m in tensor_moments(parts):
        merged = merged.merge(m)
    (whole,) = tensor_moments([torch.cat(parts)])
    assert merged.n == whole.n and merged.lo == whole.lo and merged.hi == whole.hi
    assert merged.mean == pytest.approx(whole.mean) and merged.m2 == pytest.approx(whole.m2)
    assert gaussian_fit(merged).sigma == pytest.approx(gaussian_fit(whole).sigma)


# ----------------------------------------------------------------------------- layer score
def test_score_on_hand_built_fits_votes_fc2():
    # every sigma 0.1, so W2 = |mu_a - mu_b|; x at 0.2, y at 0.8. For an output between
    # them W2(o,y) - W2(o,x) = 1 - 2 mu_o, hence s_l = 2 |mu_l - mu_{l-1}|:
    # conv2 0.30 -> fc1 0.45 (s 0.30) -> fc2 0.50 (s 0.10) -> classifier 0.70 (s 0.40).
    x, y = GaussianFit(0.2, 0.1), GaussianFit(0.8, 0.1)
    fits = [
        GaussianFit(0.5, 0.1),
        GaussianFit(0.30, 0.1),
        GaussianFit(0.45, 0.1),
        GaussianFit(0.50, 0.1),
        GaussianFit(0.70, 0.1),
    ]
    scores = candidate_scores(fits, x, y, candidate_index=[2, 3, 4])  # conv1 conv2 fc1 fc2 classifier
    assert scores == pytest.approx([0.30, 0.10, 0.40])
    assert batch_vote(scores) == 1  # fc2


def test_paper_and_code_scores_by_hand():
    out, prev, x, y = GaussianFit(0.5, 0.1), GaussianFit(0.3, 0.1), GaussianFit(0.2, 0.1), GaussianFit(0.8, 0.3)
    oy, py = math.hypot(0.3, 0.2), math.hypot(0.5, 0.2)  # 0.36056, 0.53852
    ox, px = 0.3, 0.1
    assert layer_score(out, prev, x, y, "paper") == pytest.approx(
        abs((oy - ox) - (py - px))
    )  # 0.06056 - 0.43852 -> 0.377961
    assert layer_score(out, prev, x, y, "paper") == pytest.approx(0.377961, abs=1e-6)
    assert layer_score(out, prev, x, y, "code") == pytest.approx(
        abs(abs(oy - py) - abs(ox - px))
    )  # |0.177961 - 0.2| = 0.022039
    assert layer_score(out, prev, x, y, "code") == pytest.approx(0.022039, abs=1e-6)
    assert layer_score(out, prev, x, y, "paper", "mean_only") == pytest.approx(abs((0.3 - 0.3) - (0.5 - 0.1)))
    with pytest.raises(ValueError, match="score_mode"):
        layer_score(out, prev, x, y, "other")


def test_scorer_agrees_with_an_independent_numpy_computation():
    g = torch.Generator().manual_seed(5)
    x, y = torch.rand(10, 1, 6, 6, generator=g), torch.randint(0, 4, (10,), generator=g)
    outs = [torch.randn(10, n, generator=g) for n in (30, 20, 12, 4)]

    def fit(t):
        a = t.double().numpy().ravel()
        a = (a - a.min()) / (a.max() - a.min())
        return a.mean(), a.std(ddof=1)

    def dist(a, b):
        return math.hypot(a[0] - b[0], a[1] - b[1])

    fx, fy = fit(x), fit(y)
    fo = [fit(o) for o in outs]
    expected = [
        abs((dist(fo[i], fy) - dist(fo[i], fx)) - (dist(fo[i - 1], fy) - dist(fo[i - 1], fx))) for i in (1, 2, 3)
    ]
    scorer = LayerScorer(["conv", "fc1", "fc2", "classifier"], ["fc1", "fc2", "classifier"])
    scorer.observe(x, y, outs)
    m = scorer.metrics()
    assert [m[f"s_mean_{c}"] for c in ("fc1", "fc2", "classifier")] == pytest.approx(expected)
    assert (
        m["vote"] == int(np.argmin(expected))
        and m[f"votes_{['fc1', 'fc2', 'classifier'][int(np.argmin(expected))]}"] == 1
    )


def test_first_group_candidate_uses_the_input_as_previous_output():
    x, y = GaussianFit(0.2, 0.1), GaussianFit(0.8, 0.1)
    assert candidate_scores([GaussianFit(0.6, 0.1)], x, y, [0]) == pytest.approx([2 * 0.4])


# ----------------------------------------------------------------------------- votes
def test_batch_and_client_votes_and_their_ties():
    assert batch_vote([0.3, 0.1, 0.1]) == 1  # exact tie: earlier candidate (no fc2 prior)
    assert batch_vote([0.0, 0.0, 0.0]) == 0
    assert client_vote([2, 2, 1], [0.3, 0.2, 0.1]) == 1  # tie on counts: lower mean score
    assert client_vote([2, 2, 0], [0.2, 0.2, 0.0]) == 0  # then candidate order
    assert client_vote([1, 3, 0], [0.0, 0.9, 0.0]) == 1  # the count decides first


def test_scorer_client_vote_is_the_most_frequent_batch_vote():
    scorer = LayerScorer(["a", "b", "c"], ["a", "b", "c"])
    for scores in ([0.1, 0.5, 0.9], [0.5, 0.1, 0.9], [0.4, 0.2, 0.1], [0.5, 0.05, 0.9]):
        scorer.counts[batch_vote(scores)] += 1
        scorer.score_sums = [s + t for s, t in zip(scorer.score_sums, scores)]
        scorer.batches += 1
    m = scorer.metrics()
    assert (m["vote"], m["votes_a"], m["votes_b"], m["votes_c"]) == (1, 1, 2, 1)
    assert m["s_mean_b"] == pytest.approx((0.5 + 0.1 + 0.2 + 0.05) / 4)
    assert LayerScorer(["a", "b"], ["b"]).metrics() == {"vote": -1.0, "scored_batches": 0.0}


def test_round_winner_and_personal_layer_tie_rules():
    assert round_winner([0, 1, 1, 2], [5, 1, 9], 3) == 1
    assert round_winner([0, 1, 1, 0], [5, 7, 0], 3) == 1  # 2-2 tie: more batch votes
    assert round_winner([0, 1], [5, 5, 0], 3) == 0  # then the earlier candidate
    assert round_winner([], [0, 0, 0], 3) is None
    assert personal_layer_index([1, 2, 1, 2], [0, 5, 6], 3) == 2  # 2-2 tie: more client votes in phase 1
    assert personal_layer_index([1, 2, 1, 2], [0, 5, 5], 3) == 1  # then the earlier candidate
    assert personal_layer_index([2, 2, 1], [9, 1, 1], 3) == 2  # the mode decides first
    assert personal_layer_index([], [0, 0, 0], 3) == 0


def test_default_candidates_are_the_fc_groups():
    assert default_candidates(["conv1", "conv2", "fc1", "fc2", "classifier"]) == ["fc1", "fc2", "classifier"]
    assert default_candidates(["conv1", "conv2", "classifier"]) == ["classifier"]
    assert default_candidates(["block1", "block2", "head"]) == ["head"]


def test_strategy_and_role_check_options_with_the_one_protocol_definition():
    from pflower.client_app.roles.fedcmd import FedCMDArgs
    from pflower.protocol.options import OptionError
    from pflower.protocol.role_args import RoleArgsError

    with pytest.raises(OptionError, match="w2_mode"):
        FedCMDArgs(**role_args_of("fedcmd", phase=1, candidates=["fc1"], w2_mode="exact"))
    with pytest.raises(RoleArgsError, match="w2_mode"):  # the role parses the message with the same class
        role.FedCMDRole(role_args_of("fedcmd", phase=1, candidates=["fc1"], w2_mode="exact"))


# ----------------------------------------------------------------------------- Eq. 7-8
def test_similarity_matrix_values():
    phi = similarity_matrix([np.array([1.0, 2.0]), np.array([1.0, 2.0]), np.array([-2.0, 1.0]), np.array([-1.0, -2.0])])
    assert phi[0, 1] == pytest.approx(1.0) and phi[0, 0] == pytest.approx(1.0)  # identical
    assert phi[0, 2] == 0.0  # orthogonal
    assert phi[0, 3] == 0.0  # opposite: clipped at 0
    assert np.allclose(phi, phi.T) and phi.min() >= 0.0 and phi.max() <= 1.0


def test_zero_vector_gives_no_nan_and_keeps_its_own_post():
    phi = similarity_matrix([np.zeros(3), np.array([1.0, 0.0, 0.0])])
    assert np.all(np.isfinite(phi)) and phi[0].tolist() == [0.0, 0.0]
    w = eq7_weights(phi)
    assert w[0].tolist() == [1.0, 0.0] and w[1] == pytest.approx([0.0, 1.0])


def test_eq7_eq8_hand_computed_three_clients():
    # v1=(1,0), v2=(1,1), v3=(0,1): cos12 = cos23 = 1/sqrt2 = 0.70711, cos13 = 0.
    # Phi = [[1, .70711, 0], [.70711, 1, .70711], [0, .70711, 1]]
    # weights: row1 = [1, .70711, 0] / 1.70711 = [.58579, .41421, 0]
    #          row2 = [.70711, 1, .70711] / 2.41421 = [.29289, .41421, .29289]
    #          row3 = [0, .41421, .58579]
    # posts p = (1, 2, 3): post1 = .58579 + .82843 = 1.41421, post2 = 2.0, post3 = .82843 + 1.75736 = 2.58579
    phi = similarity_matrix([np.array([1.0, 0.0]), np.array([1.0, 1.0]), np.array([0.0, 1.0])])
    r = 1 / math.sqrt(2)
    assert phi == pytest.approx(np.array([[1, r, 0], [r, 1, r], [0, r, 1]]), abs=1e-7)
    w = eq7_weights(phi)
    assert w == pytest.approx(
        np.array([[0.58579, 0.41421, 0], [0.29289, 0.41421, 0.29289], [0, 0.41421, 0.58579]]), abs=1e-5
    )
    assert w.sum(axis=1) == pytest.approx(np.ones(3))
    posts = [
        {"classifier.weight": np.full((2, 2), v, np.float32), "classifier.bias": np.array([v, -v], np.float32)}
        for v in (1.0, 2.0, 3.0)
    ]
    out = personalized_posts(posts, phi)
    for got, want in zip(out, (1.41421, 2.0, 2.58579)):
        assert got["classifier.weight"] == pytest.approx(np.full((2, 2), want), abs=1e-5)
        assert got["classifier.bias"] == pytest.approx(np.array([want, -want]), abs=1e-5)
        assert got["classifier.weight"].dtype == np.float32


def test_eq7_identity_keeps_own_post_and_ones_give_the_uniform_mean():
    rng = np.random.default_rng(6)
    posts = [{"w": rng.normal(size=(3, 2)).astype(np.float32)} for _ in range(4)]
    own = personalized_posts(posts, np.eye(4))
    assert all(np.allclose(o["w"], p["w"]) for o, p in zip(own, posts))
    uniform = personalized_posts(posts, np.ones((4, 4)))
    mean = np.mean([p["w"] for p in posts], axis=0)
    assert all(np.allclose(u["w"], mean, atol=1e-6) for u in uniform)


# ----------------------------------------------------------------------------- role and state
@pytest.mark.parametrize("timing,granularity", [("during_training", "batch"), ("after_training", "dataset")])
def test_role_votes_during_or_after_training(timing, granularity):
    from pflower.client_app.roles import RoleContext, build_role

    model = build_model("lenet5", (1, 28, 28), 10, seed=0)
    g = torch.Generator().manual_seed(7)
    data = type("D", (), {"x_train": torch.rand(40, 1, 28, 28, generator=g), "y_train": torch.full((40,), 2)})()
    args = role_args_of(
        "fedcmd", phase=1, candidates=["fc1", "fc2", "classifier"], selection_timing=timing, granularity=granularity
    )
    ctx = RoleContext(torch.device("cpu"), g, 1, [])
    m = build_role("fedcmd", args).fit(model, data, TrainArgs(epochs=2, batch_size=16), ctx)
    assert all(math.isfinite(v) for v in m.values())  # one-class data: labels are constant
    assert 0 <= m["vote"] <= 2 and {"votes_fc1", "s_mean_fc2", "train_loss"} <= set(m)
    if granularity == "dataset":
        assert sum(m[f"votes_{c}"] for c in ("fc1", "fc2", "classifier")) == 1
    else:
        assert m["scored_batches"] == 6  # 2 epochs x batches of 16, 16, 8
    plain = build_role("fedcmd", role_args_of("fedcmd", phase=2, candidates=["fc1"])).fit(
        model, data, TrainArgs(epochs=1, batch_size=16), ctx
    )
    assert set(plain) == {"train_loss"}


def test_state_round_trips_through_a_plain_dict():
    st = FedCMDState(
        candidates=["fc1", "fc2", "classifier"],
        votes={1: {0: "fc2", 3: "fc1"}, 2: {1: "fc2"}},
        round_winners={1: "fc1", 2: "fc2"},
        personal_layer="fc2",
        phi_init={"groups.fc2.0.weight": np.ones((2, 2), np.float32)},
        post_init={"groups.classifier.bias": np.zeros(3, np.float32)},
        post_store={3: {"groups.classifier.bias": np.arange(3, dtype=np.float32)}},
        phi_seen={3, 0},
    )
    d = st.to_dict()
    assert d["votes"] == [[1, 0, "fc2"], [1, 3, "fc1"], [2, 1, "fc2"]] and d["phi_seen"] == [0, 3]
    back = FedCMDState.from_dict(d)
    assert back.votes == st.votes and back.round_winners == st.round_winners and back.phi_seen == st.phi_seen
    assert back.personal_layer == "fc2" and np.array_equal(back.post_store[3]["groups.classifier.bias"], np.arange(3))
    assert back.total_client_votes() == [1, 2, 0] and back.winners_in_order() == ["fc1", "fc2"]
    d["post_store"]["3"]["groups.classifier.bias"][0] = 99  # to_dict hands out copies
    assert st.post_store[3]["groups.classifier.bias"][0] == 0
