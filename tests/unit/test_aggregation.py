import numpy as np
import pytest

from pflower.strategies.shared.aggregation import fedavg, mixing_average, normalized_weights, weighted_average


def test_fedavg_matches_hand_computed_values():
    a = {"w": np.array([1.0, 2.0], np.float32), "b": np.array([0.0], np.float32)}
    b = {"w": np.array([3.0, 6.0], np.float32), "b": np.array([4.0], np.float32)}
    out = fedavg([a, b], [10, 30])  # weights 0.25, 0.75
    np.testing.assert_allclose(out["w"], [2.5, 5.0])
    np.testing.assert_allclose(out["b"], [3.0])
    assert out["w"].dtype == np.float32


def test_weighted_average_of_identical_updates_is_identity():
    u = {"w": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)}
    out = weighted_average([u, u, u], [1, 5, 9])
    np.testing.assert_allclose(out["w"], u["w"], rtol=1e-6)


@pytest.mark.parametrize("weights", [[0, 0], [-1, 2], [float("nan"), 1.0]])
def test_bad_weights_raise(weights):
    with pytest.raises(ValueError):
        normalized_weights(weights)


def test_mixing_average_identity_keeps_own_and_ones_gives_mean():
    ups = [{"w": np.array([float(i)], np.float32)} for i in range(3)]
    own = mixing_average(ups, np.eye(3))
    assert [float(o["w"][0]) for o in own] == [0.0, 1.0, 2.0]
    mean = mixing_average(ups, np.ones((3, 3)))
    assert all(float(o["w"][0]) == pytest.approx(1.0) for o in mean)
    # a hand-computed row: weights (1, 1, 2)/4 -> (0 + 1 + 4) / 4
    mixed = mixing_average(ups, np.array([[1, 1, 2], [1, 0, 0], [0, 0, 1]]))
    assert float(mixed[0]["w"][0]) == pytest.approx(1.25)
