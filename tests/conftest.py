"""Shared fixtures: configs composed from conf/, an in-process Grid, small runs."""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Deployed-node code paths cache partitions under $XDG_CACHE_HOME: never the user's own."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture
def compose(tmp_path):
    """compose(*overrides) -> DictConfig with outputs under tmp_path."""
    from server_app.config import compose_config

    def _compose(*overrides: str):
        return compose_config([f"output_dir={tmp_path / 'outputs'}", *overrides])

    return _compose


@pytest.fixture
def tiny_overrides() -> list[str]:
    """A few seconds of training on synthetic data: for strategy and client tests."""
    return [
        "dataset=synthetic",
        "dataset.options.num_samples=600",
        "num_clients=4",
        "rounds=2",
        "fraction=0.5",
        "local_epochs=1",
        "partition.min_size=20",
        "alpha=1.0",
    ]
