"""The batched server math (one BLAS product per block of parameters) against plain per-client references."""

import numpy as np
import pytest

from pflower.models import build_model
from pflower.strategies import build_strategy, client_spec
from pflower.strategies.pfedla import hypernet_coefficients
from pflower.strategies.shared import aggregation
from pflower.strategies.shared.aggregation import column_blocks, distinct_columns, mixing_average, weighted_average
from pflower.strategies.shared.aggregation import layerwise_mix as personalize
from pflower.strategies.shared.clustering import bipartition
from pflower.strategies.shared.model_distance import (
    difference,
    gram_matrix,
    inner_products,
    spread,
    squared_norms,
    update_statistics,
)

RNG = np.random.default_rng(0)
SHAPES = {"a": (3, 5), "b": (7,), "c": (2, 2, 3)}


def models(m: int) -> list[dict[str, np.ndarray]]:
    return [{k: RNG.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()} for _ in range(m)]


@pytest.fixture
def tiny_blocks(monkeypatch):
    """Blocks of a few columns, so that keys are split across blocks and blocks end inside keys."""
    monkeypatch.setattr(aggregation, "SCRATCH_BYTES", 8 * 8 * 3)


def test_column_blocks_cover_every_key_in_order(tiny_blocks):
    ws = models(4)
    seen = {k: np.zeros((4, int(np.prod(s)))) for k, s in SHAPES.items()}
    for key, start, stop, block in column_blocks(ws, list(SHAPES)):
        assert (
            block.dtype == np.float64 and block.shape == (4, stop - start) and stop - start <= 6
        )  # 192 B / 8 B / 4 rows
        seen[key][:, start:stop] = block
    for k in SHAPES:
        np.testing.assert_array_equal(seen[k], np.stack([w[k].reshape(-1) for w in ws]))


def test_rectangular_mixing_with_repeated_models_equals_per_row_weighted_averages(tiny_blocks):
    ws = models(3)
    columns = [ws[0], ws[1], ws[0], ws[2], ws[2]]  # a default model standing in for several clients
    mix = RNG.uniform(0, 1, (4, 5))
    out = mixing_average(columns, mix)
    assert len(out) == 4
    for row, got in zip(mix, out):
        want = weighted_average(columns, row)
        assert all(got[k].dtype == np.float32 and got[k].shape == SHAPES[k] for k in SHAPES)
        for k in SHAPES:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)
    unique, merged, index = distinct_columns(columns, mix)
    assert len(unique) == 3 and index.tolist() == [0, 1, 0, 2, 2]
    np.testing.assert_allclose(merged[:, 0], mix[:, 0] + mix[:, 2])
    with pytest.raises(ValueError, match="one column per update"):
        mixing_average(columns, np.ones((2, 4)))


def test_blocked_inner_products_and_update_statistics_match_the_direct_forms(tiny_blocks):
    a, b, ref = models(3), models(4), models(1)[0]
    flat = lambda ws: np.stack([np.concatenate([w[k].astype(np.float64).reshape(-1) for k in SHAPES]) for w in ws])  # noqa: E731
    np.testing.assert_allclose(inner_products(a, b, list(SHAPES)), flat(a) @ flat(b).T, rtol=1e-12)
    np.testing.assert_allclose(gram_matrix(a, list(SHAPES)), flat(a) @ flat(a).T, rtol=1e-12)
    weights = [1.0, 2.0, 5.0]
    gram, mean_norm = update_statistics(a, ref, weights, list(SHAPES))
    deltas = [difference(w, ref, list(SHAPES)) for w in a]  # what CFL built before
    np.testing.assert_allclose(gram, gram_matrix(deltas, list(SHAPES)), rtol=1e-12)
    mean = weighted_average(deltas, weights, keys=list(SHAPES))
    assert mean_norm == pytest.approx(float(np.sqrt(squared_norms([mean], list(SHAPES))[0])), rel=1e-12)
    d = flat(a)[:, None, :] - flat(a)[None, :, :]
    pairwise = np.sum(d**2, axis=2)[~np.eye(3, dtype=bool)].mean()
    assert 2 * spread(a, list(SHAPES)) / (3 - 1) == pytest.approx(pairwise, rel=1e-12)  # FedAMP's O(m P) diagnostic


def test_pfedla_coefficients_of_a_round_equal_each_clients_own(tiny_blocks):
    ws, trained = models(5), models(3)
    columns = [ws[0], ws[1], ws[2], ws[2], ws[3]]  # clients 2 and 3 share a stored (initial) model
    layer_keys = [["a"], ["b", "c"]]
    alphas = RNG.uniform(0.1, 1.0, (3, 2, 5)).astype(np.float32)
    coef, gap = hypernet_coefficients(columns, trained, alphas, layer_keys)
    for c in range(3):
        pers = personalize(columns, alphas[c], layer_keys)
        want = np.stack(
            [inner_products([{k: pers[k] - trained[c][k] for k in keys}], columns, keys)[0] for keys in layer_keys]
        )
        np.testing.assert_allclose(coef[c], want, rtol=1e-6, atol=1e-9)
        assert gap[c] == pytest.approx(
            sum(float(np.sum((pers[k] - trained[c][k]).astype(np.float64) ** 2)) for k in SHAPES), rel=1e-6
        )


@pytest.fixture(scope="module")
def lenet():
    return build_model("lenet5", (1, 28, 28), 10, seed=0)


def uploads(strategy, n):
    keys = list(strategy.model.global_arrays)
    return {
        c: {
            k: (v + 0.05 * RNG.standard_normal(v.shape)).astype(np.float32)
            for k, v in strategy.model.global_arrays.items()
            if k in keys
        }
        for c in range(n)
    }


def test_fedamp_round_of_cloud_models_equals_the_per_client_attention(lenet):
    strategy = build_strategy("fedamp", lenet, client_spec(), num_clients=5, fraction_train=1.0)
    strategy.models = {c: m for c, m in uploads(strategy, 5).items() if c != 3}  # client 3 never trained
    clouds = strategy.extra_downlinks([0, 3, 4], 2)
    for c in (0, 3, 4):
        ms, row = strategy.cloud_weights(c)
        want = weighted_average(ms, row, keys=list(strategy.model.global_arrays))
        for k, v in want.items():
            np.testing.assert_allclose(clouds[c]["u/" + k], v, rtol=1e-5, atol=1e-7)


def test_fedap_and_pfedsim_rounds_of_downlinks_equal_their_single_client_form(lenet):
    fedap = build_strategy("fedap", lenet, client_spec(), num_clients=4, fraction_train=1.0, method_args={"warmup": 0})
    keys = fedap.travelling_keys(fedap.model.groups, 0, 1)
    fedap.models = {c: {k: m[k] for k in keys} for c, m in uploads(fedap, 3).items()}
    fedap.stats = {
        c: {f"bn_{s}/{i}": RNG.uniform(0.5, 1.5, ch) for i, ch in enumerate(fedap.bn_channels) for s in ("mean", "var")}
        for c in range(3)
    }
    down = fedap.downlinks([0, 1, 2, 3], 1)
    for c in range(4):
        w = fedap.weights(c)
        want = weighted_average(
            [fedap.models.get(j, fedap.model.global_arrays) for j in w], list(w.values()), keys=keys
        )
        assert set(down[c]) == set(keys)
        for k in keys:
            np.testing.assert_allclose(down[c][k], want[k], rtol=1e-5, atol=1e-7)
    pfedsim = build_strategy(
        "pfedsim", lenet, client_spec(), num_clients=4, fraction_train=1.0, method_args={"warmup": 0}
    )
    body = pfedsim.model.keys(pfedsim.body)
    pfedsim.bodies = {c: {k: m[k] for k in body} for c, m in uploads(pfedsim, 3).items()}
    pfedsim.sim = np.array([[1, 0.5, 0.2, 0], [0.5, 1, 0.9, 0], [0.2, 0.9, 1, 0], [0, 0, 0, 1.0]])
    pfedsim.head_seen = {0, 1}
    down = pfedsim.downlinks([0, 2, 3], 1)
    assert set(down[0]) == set(body) and set(down[2]) == set(down[3]) == set(pfedsim.model.global_arrays)  # head once
    for c in (0, 2, 3):
        w = pfedsim.body_weights(c)
        warm = {k: pfedsim.model.global_arrays[k] for k in body}
        want = weighted_average([pfedsim.bodies.get(j, warm) for j in w], list(w.values()), keys=body)
        for k in body:
            np.testing.assert_allclose(down[c][k], want[k], rtol=1e-5, atol=1e-7)


def _bipartition_rescan(s):
    """The plain O(n^3) form: rescan every pair after every merge (the previous implementation)."""
    clusters, link = [[i] for i in range(len(s))], np.array(s, dtype=np.float64)
    while len(clusters) > 2:
        rows, cols = np.triu_indices(len(clusters), 1)
        best = int(np.argmax(link[rows, cols]))
        a, b = int(rows[best]), int(cols[best])
        clusters[a] += clusters.pop(b)
        link[a], link[:, a] = np.minimum(link[a], link[b]), np.minimum(link[:, a], link[:, b])
        link = np.delete(np.delete(link, b, axis=0), b, axis=1)
    first, second = sorted(clusters[0]), sorted(clusters[1])
    return (first, second) if 0 in first else (second, first)


def test_bipartition_merges_exactly_as_the_full_rescan_ties_included():
    for trial in range(300):
        n = int(RNG.integers(2, 25))
        v = RNG.standard_normal((n, 3))
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        s = np.round(v @ v.T, 1) if trial % 2 else RNG.integers(-2, 3, (n, n)).astype(float)  # many ties
        assert bipartition(s) == _bipartition_rescan(s)


def test_fedfomo_choice_keeps_its_tie_rules(lenet):
    strategy = build_strategy(
        "fedfomo", lenet, client_spec(), num_clients=8, fraction_train=1.0, method_args={"m": 3, "pool": "all"}
    )
    strategy.models = {j: {} for j in (5, 1, 7, 2, 4, 0)}
    strategy.model_round = {5: 2, 1: 3, 7: 3, 2: 1, 4: 3, 0: 3}
    strategy.affinity[0, [1, 2, 4, 5, 7]] = [0.5, 0.5, 0.5, 0.5, 0.2]
    # affinity 0.5 ties between 1, 2, 4, 5: the more recent (1, 4: round 3) first, then the lower id (1 < 4), then 5
    # (round 2)
    assert strategy.choose(0) == [1, 4, 5]
    strategy.pool = "latest"  # only the round-3 models: 1, 4, 7 (0 is the client itself)
    assert strategy.choose(0) == [1, 4, 7]


# ----------------------------------------------------------------------------- clusters, similarity, phases
def _update(cid, value, n=1, keys=("w",)):
    from pflower.strategies.base.validation import ClientUpdate

    return ClientUpdate(cid, 100 + cid, {k: np.full(2, value, np.float32) for k in keys}, n, {})


def test_clusters_group_average_inside_and_place_new_clients():
    from pflower.strategies.shared.clusters import Clusters, cluster_fedavg

    clusters = Clusters([[3, 0], [1, 2]], [{"w": np.zeros(2)}, {"w": np.ones(2)}])
    assert clusters.members == [[0, 3], [1, 2]] and clusters.of(3) == 0 and clusters.model_of(2)["w"][0] == 1
    grouped = clusters.group([_update(2, 4.0, 3), _update(0, 1.0), _update(1, 2.0, 1), _update(9, 5.0)])
    assert {c: [u.client_id for u in ups] for c, ups in grouped.items()} == {0: [0], 1: [1, 2]}  # 9: in no cluster
    np.testing.assert_allclose(cluster_fedavg(grouped[1])["w"], [3.5, 3.5])  # (2*1 + 4*3) / 4
    clusters.add(7, clusters.largest())
    assert clusters.members[0] == [0, 3, 7] and clusters.sizes() == [3, 2]
    with pytest.raises(ValueError, match="two clusters"):
        Clusters([[0, 1], [1]], [{}, {}])
    again = Clusters.from_dict(clusters.to_dict())
    assert again.members == clusters.members and again.of(7) == 0


def test_cosine_from_gram_and_from_vectors_agree_and_clip():
    from pflower.strategies.shared.similarity import cosine_from_gram, cosine_of_vectors

    v = [np.array([1.0, 0.0]), np.array([-1.0, 0.0]), np.array([1.0, 1.0]), np.zeros(2)]
    gram = np.stack(v) @ np.stack(v).T
    np.testing.assert_allclose(cosine_from_gram(gram), cosine_of_vectors(v), atol=1e-12)
    signed, eq8 = cosine_of_vectors(v), cosine_of_vectors(v, 1e-8, lo=0.0)
    assert signed[0, 1] == pytest.approx(-1) and eq8[0, 1] == 0 and eq8[0, 2] == pytest.approx(2**-0.5)
    assert signed[3].tolist() == [0, 0, 0, 0]  # a zero vector is similar to nothing


def test_phase_rounds_explicit_or_share_of_the_run():
    from pflower.strategies.base.phases import phase_rounds

    assert phase_rounds("kp", 20, None, None) == 20
    assert phase_rounds("kp", None, 0.1, 200, "round") == 20 and phase_rounds("w", None, 0.5, 15) == 7
    assert phase_rounds("warm-up", None, 0.05, 30, "ceil") == 2  # Felo/Velo: ceil(0.05 T)
    with pytest.raises(ValueError, match="rho"):
        phase_rounds("kp", None, 1.5, 100, ratio_name="rho")
