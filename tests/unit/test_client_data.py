"""Per-client tensors: split, normalization, caching and the server-side public split."""

import numpy as np
import pytest
import torch

from pflower.federated_data import DataSpec, load_client_data, load_public_data, partition_sizes
from pflower.federated_data.client_data import _partition, _pool, client_indices

SPEC = DataSpec(dataset="synthetic", options=(("num_samples", 800),), num_clients=5, alpha=1.0, min_size=20)


def test_client_split_is_disjoint_normalized_and_cached():
    data = load_client_data(SPEC, 2)
    train, test = client_indices(SPEC, 2)
    assert set(train).isdisjoint(test) and abs(len(train) - len(test)) <= 1
    assert data.x_train.shape[1:] == (1, 28, 28) and data.x_train.dtype == torch.float32
    assert data.num_train == len(train) and data.num_test == len(test)
    assert load_client_data(SPEC, 2) is data  # built once per process
    everyone = torch.cat([load_client_data(SPEC, c).x_train for c in range(5)])
    assert abs(float(everyone.mean())) < 0.1 and abs(float(everyone.std()) - 1) < 0.1


def test_partition_sizes_add_up_and_clients_outside_range_are_refused():
    assert sum(partition_sizes(SPEC)) == 800
    with pytest.raises(ValueError, match="num-supernodes"):
        load_client_data(SPEC, 5)


def test_holdout_public_split_is_kept_out_of_the_clients():
    spec = DataSpec(**{**SPEC.to_dict(), "options": SPEC.options, "public": "holdout", "public_fraction": 0.25})
    images, labels = load_public_data(spec)
    assert images.shape[0] == 200 and labels.shape == (200,) and sum(partition_sizes(spec)) == 600
    with pytest.raises(ValueError, match="public"):
        load_public_data(SPEC)


def test_public_test_split_needs_an_official_test_split():
    spec = DataSpec(**{**SPEC.to_dict(), "options": SPEC.options, "public": "test"})
    with pytest.raises(ValueError, match="holdout"):
        partition_sizes(spec)


def test_digits_is_upsampled_to_lenet_input():
    spec = DataSpec(dataset="digits", num_clients=10, alpha=0.5)
    data = load_client_data(spec, 0)
    assert data.x_train.shape[1:] == (1, 28, 28) and data.num_classes == 10
    assert np.isclose(sum(partition_sizes(spec)), 1797)


def test_subsample_keeps_a_fixed_fraction_before_partitioning_and_refuses_bad_values():
    spec = DataSpec(**{**SPEC.to_dict(), "options": SPEC.options, "subsample": 0.25, "min_size": 5})
    assert sum(partition_sizes(spec)) == 200
    first = torch.cat([load_client_data(spec, c).x_train for c in range(5)])
    for cached in (load_client_data, _pool, _partition):
        cached.cache_clear()
    assert torch.equal(
        first, torch.cat([load_client_data(spec, c).x_train for c in range(5)])
    )  # the same subset, redrawn
    with pytest.raises(ValueError, match="subsample"):
        partition_sizes(DataSpec(**{**SPEC.to_dict(), "options": SPEC.options, "subsample": 0.0}))
