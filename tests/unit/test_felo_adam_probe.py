"""benchmarks/authors/felo_adam_probe.py: its fresh-Adam arm is pflower's own client training."""

from __future__ import annotations

import pytest
import torch

from benchmarks.authors import felo_adam_probe as probe
from pflower.client_app.training import TrainArgs, train
from pflower.models import build_model


def _tiny() -> torch.nn.Module:
    return build_model("cnn_felo", (1, 12, 12), 10, seed=3, channels=(4, 8), feature_dim=16)


@pytest.fixture
def data() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(120, 1, 12, 12, generator=g), torch.randint(0, 10, (120,), generator=g)
    return x, y, x[:40], y[:40]


def _weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_the_fresh_arm_trains_as_pflowers_clients_do(monkeypatch: pytest.MonkeyPatch, data) -> None:  # noqa: ANN001
    monkeypatch.setattr(probe, "SESSIONS", 3)
    monkeypatch.setattr(probe, "DROP", 2)
    x, y, xt, yt = data
    fresh = _tiny()
    probe.sessions(fresh, x, y, xt, yt, keep=False, seed=5)

    client = _tiny()
    generator = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    for lr in (probe.LR, probe.LR, probe.LR * 0.1):  # the run's schedule: x0.1 from session DROP + 1
        args = TrainArgs(batch_size=probe.BATCH, steps=probe.STEPS, optimizer="adam", lr=lr)
        train(client, x, y, args, generator=generator)
    assert torch.equal(_weights(fresh), _weights(client))


def test_the_kept_arm_differs_from_the_second_session_on(monkeypatch: pytest.MonkeyPatch, data) -> None:  # noqa: ANN001
    x, y, xt, yt = data
    monkeypatch.setattr(probe, "SESSIONS", 1)
    one_fresh, one_kept = _tiny(), _tiny()
    probe.sessions(one_fresh, x, y, xt, yt, keep=False, seed=5)
    probe.sessions(one_kept, x, y, xt, yt, keep=True, seed=5)
    assert torch.equal(_weights(one_fresh), _weights(one_kept))  # one session: a new Adam either way

    monkeypatch.setattr(probe, "SESSIONS", 2)
    two_fresh, two_kept = _tiny(), _tiny()
    probe.sessions(two_fresh, x, y, xt, yt, keep=False, seed=5)
    probe.sessions(two_kept, x, y, xt, yt, keep=True, seed=5)
    assert not torch.allclose(_weights(two_fresh), _weights(two_kept))
