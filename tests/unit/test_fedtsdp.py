"""FedTSDP: the math on hand-made inputs with hand-worked expected values (FedTSDP paper, set-up, scaled to a CPU), and
the
round through the in-process grid (prefix routing, personal units kept, re-clustering, h_th=inf = FedAvg)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from method_helpers import train_messages, trained_states
from scipy.spatial.distance import jensenshannon
from sklearn.metrics import adjusted_rand_score
from test_strategy_base import make, run

import pflower.client_app.runtime as runtime
from pflower.server_app.config import ConfigError
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies.fedtsdp_math import (
    amend_weights,
    dbscan_groups,
    decay_shared,
    default_m_tilde,
    draw_batch,
    hopkins,
    js_matrix,
    pair_spread,
    stage2_radius,
    two_stage,
    upper_pairs,
    weight_distances,
)

TSDP = ["method=fedtsdp", "dataset.public=holdout", "dataset.public_fraction=0.2", "fraction=1.0"]


# ----------------------------------------------------------------------------- math
def test_js_matrix_is_the_squared_scipy_distance_symmetric_and_bounded():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(10), size=(5, 7))  # 5 clients, 7 public samples
    js = js_matrix(p)
    expected = np.array([[np.mean(jensenshannon(p[i], p[j], axis=1) ** 2) for j in range(5)] for i in range(5)])
    np.testing.assert_allclose(js, expected, atol=1e-12)
    assert np.array_equal(js, js.T) and np.all(np.diag(js) == 0) and js.max() <= math.log(2)
    onehot = np.zeros((2, 3, 4))
    onehot[0, :, 0] = onehot[1, :, 1] = 1.0  # disjoint classes: the maximum, ln 2
    assert js_matrix(onehot)[0, 1] == pytest.approx(math.log(2))


def test_hopkins_separates_blobs_from_noise_as_the_spec_measured():
    def mean_h(make_points, draws=60):
        rng = np.random.default_rng(1)
        return np.mean([hopkins(make_points(rng), 2, rng) for _ in range(draws)])

    one_blob = mean_h(lambda r: r.standard_normal((20, 500)))
    two_blobs = mean_h(lambda r: np.concatenate([r.normal(0, 0.1, (10, 500)), r.normal(3, 0.1, (10, 500))]))
    assert 0.45 < one_blob < 0.6 and two_blobs > 0.85
    pairs = np.repeat(np.random.default_rng(2).standard_normal((10, 50)), 2, axis=0)  # duplicated points: v = 0
    assert hopkins(pairs, 2, np.random.default_rng(3)) == pytest.approx(1.0, abs=1e-6)
    assert hopkins(np.ones((6, 5)), 2, np.random.default_rng(3)) == 0.0
    assert hopkins(np.ones((2, 5)), 2, np.random.default_rng(3)) == 0.0  # fewer than 3 clients
    assert [default_m_tilde(m) for m in (3, 20, 100)] == [2, 2, 10]


def test_dbscan_noise_becomes_singletons_and_two_stages_split_further():
    d = np.full((5, 5), 10.0)
    d[np.ix_([0, 1], [0, 1])] = d[np.ix_([2, 3], [2, 3])] = 0.1
    np.fill_diagonal(d, 0)
    assert dbscan_groups(d, 1.0, 2) == [[0, 1], [2, 3], [4]]
    assert dbscan_groups(d, math.inf, 2) == [[0, 1, 2, 3, 4]]
    js = np.zeros((6, 6))
    js[:3, 3:] = js[3:, :3] = 0.6  # stage 1: {0,1,2} and {3,4,5}
    w = np.zeros((6, 6))
    w[np.ix_([0, 1], [2])] = w[np.ix_([2], [0, 1])] = 9.0  # stage 2 splits 2 off the first group
    first, second = two_stage(js, lambda rows: w[np.ix_(rows, rows)], 0.15, 3.5, 1)
    assert first == [[0, 1, 2], [3, 4, 5]] and second == [[0, 1], [2], [3, 4, 5]]
    assert two_stage(js, lambda rows: w[np.ix_(rows, rows)], 0.15, math.inf, 1)[1] == first


def test_stage2_radius_by_hand_and_the_median_mode_carries_across_scales():
    d = np.array(
        [[0.0, 1.0, 4.0, 2.0], [1.0, 0.0, 3.0, 5.0], [4.0, 3.0, 0.0, 6.0], [2.0, 5.0, 6.0, 0.0]]
    )  # pair median 3.5
    assert stage2_radius(d, 0.5) == 0.5 and stage2_radius(d, 0.5, "absolute") == 0.5
    assert stage2_radius(d, 0.5, "median") == pytest.approx(1.75)
    assert stage2_radius(d, math.inf, "median") == math.inf
    with pytest.raises(ValueError, match="eps2 mode"):
        stage2_radius(d, 0.5, "quantile")
    # two pairs, 1 apart inside and 10 across (pair median 10): the same groups at any scale at a
    # radius from the median mode; an absolute 0.5 splits everything at scale 1 and nothing apart at 0.1
    w = np.full((4, 4), 10.0)
    w[0, 1] = w[1, 0] = w[2, 3] = w[3, 2] = 1.0
    np.fill_diagonal(w, 0)
    js = np.zeros((4, 4))  # stage 1: one group
    for scale in (1.0, 0.1):
        radius = stage2_radius(scale * w, 0.5, "median")
        assert radius == pytest.approx(scale * 5.0)
        assert two_stage(js, lambda rows: scale * w[np.ix_(rows, rows)], 0.15, radius, 2)[1] == [[0, 1], [2, 3]]
    assert two_stage(js, lambda rows: w[np.ix_(rows, rows)], 0.15, 0.5, 2)[1] == [[0], [1], [2], [3]]
    assert two_stage(js, lambda rows: 0.1 * w[np.ix_(rows, rows)], 0.15, 0.5, 2)[1] == [[0, 1], [2, 3]]


def test_pair_spread_of_a_distance_matrix_by_hand():
    d = np.array([[0.0, 1.0, 4.0, 2.0], [1.0, 0.0, 3.0, 5.0], [4.0, 3.0, 0.0, 6.0], [2.0, 5.0, 6.0, 0.0]])
    assert upper_pairs(d).tolist() == [1.0, 4.0, 2.0, 3.0, 5.0, 6.0]
    assert pair_spread(upper_pairs(d)) == {"min": 1.0, "median": 3.5, "max": 6.0}
    assert pair_spread(upper_pairs(np.zeros((1, 1)))) == {}  # one client: no pair, nothing logged


def test_weight_distance_is_torch_pairwise_distance():
    rng = np.random.default_rng(4)
    v = rng.standard_normal((4, 30))
    d = weight_distances(v, 1e-6)
    a, b = torch.tensor(v[1]), torch.tensor(v[3])
    assert d[1, 3] == pytest.approx(float(torch.nn.functional.pairwise_distance(a, b, eps=1e-6)), rel=1e-9, abs=1e-6)
    assert np.array_equal(d, d.T) and np.all(np.diag(d) == 0)


def test_amended_sampling_locks_in_the_triggering_batch():
    rng = np.random.default_rng(5)
    w = np.full(10_000, 1e-4)
    batch = draw_batch(w, 50, rng)
    assert len(set(batch)) == 50
    w2 = amend_weights(w, batch, len(w) / len(batch))
    assert w2.sum() == pytest.approx(1.0) and w2[batch].sum() > 0.999
    assert np.array_equal(draw_batch(w2, 50, np.random.default_rng(6)), batch)


def test_shared_unit_decay_float_and_int():
    units, seq = 8.0, []
    for _ in range(15):
        units = decay_shared(units, 0.98, "float")
        seq.append(math.floor(units))
    assert seq[0] == 7 and seq[5] == 7 and seq[6] == 6 and seq[14] == 5  # 6 at the 7th, 5 at the 15th trigger
    units, seq = 8.0, []
    for _ in range(3):
        units = decay_shared(units, 0.98, "int")
        seq.append(units)
    assert seq == [7, 6, 5]


# ----------------------------------------------------------------------------- the round
@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_with_h_th_inf_fedtsdp_is_fedavg_exactly(compose, tiny_overrides):
    base = [*tiny_overrides, "fraction=1.0", "dataset.public=holdout", "dataset.public_fraction=0.2", "model=cnn_kapc"]
    _, avg = make(compose, base, "method=fedavg")
    _, tsdp = make(compose, base, "method=fedtsdp", "method.h_th=inf")
    ra, rt = run(avg, InProcessGrid(4), 3), run(tsdp, InProcessGrid(4), 3)
    for a, t in zip(ra, rt):
        assert a["test_before_acc"] == t["test_before_acc"] and a["train_loss"] == t["train_loss"]
        assert t["triggered"] == 0 and t["shared_units"] == len(tsdp.units) and "hopkins" in t
    for k, v in avg.model.global_arrays.items():
        np.testing.assert_array_equal(v, tsdp.model.global_arrays[k])


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_hopkins_repeats_average_that_many_draws_and_one_is_the_papers_single_draw(
    compose, tiny_overrides, monkeypatch
):
    import pflower.strategies.fedtsdp as fedtsdp_module

    base = [*tiny_overrides, "fraction=1.0", "dataset.public=holdout", "dataset.public_fraction=0.2", "model=cnn_kapc"]
    for repeats, expected in ((1, 0.2), (4, 0.5)):
        draws = iter([0.2, 0.4, 0.6, 0.8])
        monkeypatch.setattr(fedtsdp_module, "hopkins", lambda points, m, rng: next(draws))
        _, tsdp = make(compose, base, "method=fedtsdp", "method.h_th=inf", f"method.hopkins_repeats={repeats}")
        record = run(tsdp, InProcessGrid(4), 1)[0]
        assert record["hopkins"] == pytest.approx(expected)
    with pytest.raises(Exception, match="hopkins_repeats must be >= 1"):
        make(compose, base, "method=fedtsdp", "method.hopkins_repeats=0")


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_reclustering_finds_swapped_label_groups_and_shrinks_the_shared_prefix(compose, tiny_overrides, monkeypatch):
    original = runtime.client_data

    def swapped(spec, cid, *args, **kwargs):  # clients 3..5 see y -> 9 - y: two concepts
        data = original(spec, cid, *args, **kwargs)
        return dataclasses.replace(data, y_train=9 - data.y_train, y_test=9 - data.y_test) if cid >= 3 else data

    monkeypatch.setattr(runtime, "client_data", swapped)
    # digits, 8 local epochs: after one round the two concepts' outputs are far apart (JS ~0.6 vs ~0.05)
    data = ["dataset=digits", "num_clients=6", "partition=iid", "local_epochs=8", "lr=0.1", "momentum=0.5"]
    _, strategy = make(compose, data, *TSDP, "method.h_th=0.0", "method.eps1=0.3", "method.eps2=inf")
    grid = InProcessGrid(6)
    records = run(strategy, grid, rounds=2)
    units = len(strategy.units)
    assert records[0]["triggered"] == 1 and records[0]["shared_units"] == math.floor(units * 0.98)
    assert records[1]["hopkins"] > 0.65  # two concepts: the paper's threshold would fire too
    truth = [0, 0, 0, 1, 1, 1]
    labels = {c: i for i, m in enumerate(records[-1]["clusters"]) for c in m}
    assert adjusted_rand_score(truth, [labels[c] for c in range(6)]) == 1.0
    # round 2+: each client receives only the first S units of its own cluster's model
    s = records[0]["shared_units"]
    for m in train_messages(grid, 2):
        assert list(m.content.array_records["arrays"].keys()) == strategy.units[:s]
    # a unit that turned personal keeps the client's own trained value
    last = strategy.units[-1]
    states = trained_states(grid)
    assert not np.array_equal(states[0][last], states[1][last])
    summary = strategy.run_summary()
    assert summary["reclusterings"][0]["round"] == 1 and summary["units"] == units
    # round 2 triggers again (h_th = 0) and finds the same two groups: a trigger, not a change
    assert [r["triggered"] for r in records] == [1, 1] and [r["partition_changed"] for r in records] == [1, 0]
    assert summary["partition_changes"] == 1 and len(summary["reclusterings"]) == 2
    json.dumps(summary)


def test_fedtsdp_needs_public_data_and_checks_its_options(compose, tiny_overrides):
    with pytest.raises(ConfigError, match=r"public unlabelled data on the server: set dataset.public=holdout"):
        make(compose, tiny_overrides, "method=fedtsdp")
    for bad, message in (
        ("method.psi=1.5", "psi must be > 0 and <= 1, got 1.5"),
        ("method.decay=log", "decay must be one of"),
        ("method.amend=x", "amend must be one of"),
        ("method.eps1=0", "eps1 must be > 0, got 0"),
    ):
        with pytest.raises(ValueError, match=message):
            make(compose, tiny_overrides, *TSDP, bad)


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_on_iid_data_h_stays_below_the_threshold_and_the_run_is_fedavg(compose):
    """The IID scenario at the paper's h_th = 0.65: no re-clustering, and the parameters equal FedAvg's."""
    # a model without BatchNorm: FedTSDP averages BN statistics, FedAvg leaves them on the clients
    data = [
        "dataset=digits",
        "num_clients=6",
        "partition=iid",
        "local_epochs=2",
        "fraction=1.0",
        "dataset.public=holdout",
        "dataset.public_fraction=0.2",
        "model=cnn_kapc",
    ]
    _, avg = make(compose, data, "method=fedavg")
    _, tsdp = make(compose, data, "method=fedtsdp")
    ra, rt = run(avg, InProcessGrid(6), 3), run(tsdp, InProcessGrid(6), 3)
    assert all(r["hopkins"] < 0.65 and r["triggered"] == 0 for r in rt), [r["hopkins"] for r in rt]
    assert [r["test_before_acc"] for r in ra] == [r["test_before_acc"] for r in rt]
    for k, v in avg.model.global_arrays.items():
        np.testing.assert_array_equal(v, tsdp.model.global_arrays[k])


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_stage_two_alone_separates_groups_whose_models_differ(compose, monkeypatch):
    """eps1 = inf: stage 1 keeps everyone together; eps2, calibrated from the round-1 weight
    distances as the paper's calibration reading says (between the within- and the between-group medians),
    splits the two concepts."""
    import pflower.strategies.fedtsdp as fedtsdp

    original = runtime.client_data

    def swapped(spec, cid, *args, **kwargs):
        data = original(spec, cid, *args, **kwargs)
        return dataclasses.replace(data, y_train=9 - data.y_train, y_test=9 - data.y_test) if cid >= 3 else data

    monkeypatch.setattr(runtime, "client_data", swapped)
    seen = []
    recorder = fedtsdp.weight_distances_from_gram
    monkeypatch.setattr(
        fedtsdp, "weight_distances_from_gram", lambda *a, **k: seen.append(recorder(*a, **k)) or seen[-1]
    )
    data = ["dataset=digits", "num_clients=6", "partition=iid", "local_epochs=8", "lr=0.1", "momentum=0.5"]
    common = [*TSDP, "method.h_th=0.0", "method.eps1=inf"]
    _, probe = make(compose, data, *common, "method.eps2=1e-9")  # every client its own cluster: D is logged
    logged = run(probe, InProcessGrid(6), rounds=1)[0]
    d = seen[0]
    # the round's record carries the spread of the distances eps2 was compared with (to calibrate it)
    pairs = d[np.triu_indices(6, k=1)]
    assert logged["weight_dist_min"] == pairs.min() and logged["weight_dist_max"] == pairs.max()
    assert logged["weight_dist_median"] == np.median(pairs)
    assert 0 <= logged["js_min"] <= logged["js_median"] <= logged["js_max"] <= math.log(2)
    within = np.median([d[i, j] for g in ([0, 1, 2], [3, 4, 5]) for i in g for j in g if i < j])
    between = np.median(d[:3, 3:])
    assert within < between
    _, strategy = make(compose, data, *common, f"method.eps2={(within + between) / 2}")
    records = run(strategy, InProcessGrid(6), rounds=1)
    assert records[0]["stage1_clusters"] == 1 and records[0]["clusters"] == [[0, 1, 2], [3, 4, 5]]
    # the same radius given as a fraction of the participants' pair median (eps2_mode=median; one
    # stage-1 group here, so the logged distances are all pairs): same split, and the round logs
    # the radius it used (pflower report draws it instead of the option)
    _, relative = make(
        compose, data, *common, "method.eps2_mode=median", f"method.eps2={(within + between) / 2 / np.median(pairs)}"
    )
    computed = len(seen)
    records = run(relative, InProcessGrid(6), rounds=1)
    assert len(seen) == computed + 1  # one stage-1 group of all six: the radius's matrix serves stage 2 too
    assert records[0]["clusters"] == [[0, 1, 2], [3, 4, 5]]
    assert records[0]["eps2_radius"] == pytest.approx((within + between) / 2)
    assert "eps2_radius" not in logged  # absolute mode: the radius is the option itself
