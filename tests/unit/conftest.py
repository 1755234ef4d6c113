"""Fixtures of the unit tests."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pflower.client_app.runtime import client_data, fresh_model
from pflower.client_app.training import TrainArgs


@pytest.fixture
def client(compose, tiny_overrides):
    """(model, data, args) of client 0 of the tiny synthetic setup, as a ClientApp builds them."""
    spec = compose(*tiny_overrides).client_spec("test-run", None, None)
    return fresh_model(spec), client_data(spec, 0), replace(TrainArgs(**spec["train"]), epochs=2)
