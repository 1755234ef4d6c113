import numpy as np
import pytest

from pflower.federated_data.partition import PartitionError, dirichlet, partition, train_test_split

LABELS = np.repeat(np.arange(10), 200)  # 2,000 samples, 10 classes


def label_skew(parts, labels=LABELS):
    """Mean over clients of the share of the client's most frequent class."""
    return float(np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in parts]))


def test_dirichlet_covers_every_sample_once_and_respects_min_size():
    parts = partition(LABELS, "dirichlet", 20, seed=1, alpha=0.3, min_size=40)
    flat = np.concatenate(parts)
    assert len(flat) == len(LABELS) and len(np.unique(flat)) == len(LABELS)
    assert min(len(p) for p in parts) >= 40


def test_dirichlet_is_deterministic_by_seed():
    a = partition(LABELS, "dirichlet", 10, seed=3, alpha=0.5)
    b = partition(LABELS, "dirichlet", 10, seed=3, alpha=0.5)
    c = partition(LABELS, "dirichlet", 10, seed=4, alpha=0.5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_label_skew_grows_as_alpha_shrinks():
    skew = {a: np.mean([label_skew(dirichlet(LABELS, 10, a, 20, seed=s)) for s in range(3)]) for a in (0.1, 1.0, 100.0)}
    assert skew[0.1] > skew[1.0] > skew[100.0]


def test_self_balancing_caps_client_size():
    parts = dirichlet(LABELS, 10, 0.1, 20, seed=0, self_balancing=True)
    # a client stops receiving once it holds the mean size; one class can overshoot it
    assert max(len(p) for p in parts) <= len(LABELS) / 10 + 200


def test_iid_sizes_are_balanced_and_shards_hold_k_classes():
    iid = partition(LABELS, "iid", 8, seed=0)
    assert {len(p) for p in iid} == {250}
    shards = partition(LABELS, "shards", 10, seed=0, shards_per_client=2)
    assert all(len(np.unique(LABELS[p])) == 2 for p in shards)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(method="dirichlet", num_clients=5, alpha=0.0), "alpha must be > 0"),
        (dict(method="dirichlet", num_clients=5, alpha=-1.0), "alpha must be > 0"),
        (dict(method="iid", num_clients=5000), "only 2000 samples"),
        (dict(method="dirichlet", num_clients=100, alpha=0.5, min_size=40), "lower num_clients"),
        (dict(method="nope", num_clients=5), "valid partitioners"),
    ],
)
def test_bad_partitions_name_the_problem(kwargs, match):
    with pytest.raises(PartitionError, match=match):
        partition(LABELS, seed=0, **kwargs)


def test_train_test_split_is_disjoint_and_halved():
    idx = np.arange(101)
    tr, te = train_test_split(idx, 0.5, seed=0)
    assert set(tr).isdisjoint(te) and len(tr) + len(te) == 101 and abs(len(tr) - len(te)) <= 1
