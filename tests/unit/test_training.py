"""The one training loop: its optimizers (torch's SGD and Adam updates without importing torch._dynamo), epochs or fixed
steps, and the per-round learning-rate schedules."""

import subprocess
import sys

import pytest
import torch

from pflower.client_app.training import TrainArgs, batch_indices, train
from pflower.models import build_model
from pflower.models.optim import PlainAdam, PlainSGD, exact_sqrt
from pflower.strategies.base.schedule import LRSchedule


@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.0, 5e-4), (0.5, 1e-3)])
def test_plain_sgd_matches_torch_sgd_bit_for_bit(momentum: float, weight_decay: float) -> None:
    torch.manual_seed(0)
    a = build_model("lenet5", (1, 28, 28), 10, seed=1)
    b = build_model("lenet5", (1, 28, 28), 10, seed=1)
    ours = PlainSGD(a.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay)
    ref = torch.optim.SGD(b.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay)
    assert_same_steps(a, ours, b, ref, steps=4)


def assert_same_steps(a, ours, b, ref, steps: int) -> None:
    """Train a with ours and b with ref on the same batches; the models stay bit-identical."""
    for _ in range(steps):
        x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
        for model, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    for (k, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), k


def test_plain_sgd_skips_parameters_without_gradients() -> None:
    p, q = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = PlainSGD([p, q], lr=0.1, momentum=0.9)
    (2 * p).sum().backward()
    opt.step()
    assert torch.allclose(p, torch.full((3,), 0.8)) and torch.equal(q, torch.ones(3))


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_training_does_not_import_dynamo() -> None:
    """The first torch.optim use costs ~3 s of import in every fresh ClientApp process."""
    code = (
        "import sys, torch\n"
        "from client_app.training import TrainArgs, train\n"
        "from models import build_model\n"
        "m = build_model('lenet5', (1, 28, 28), 10, seed=0)\n"
        "train(m, torch.randn(40, 1, 28, 28), torch.randint(0, 10, (40,)), TrainArgs(epochs=1, momentum=0.9))\n"
        "train(m, torch.randn(40, 1, 28, 28), torch.randint(0, 10, (40,)), TrainArgs(steps=3, optimizer='adam'))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_train_moves_only_the_given_parameters() -> None:
    model = build_model("lenet5", (1, 28, 28), 10, seed=0)
    frozen = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("groups.conv1")}
    params = [p for k, p in model.named_parameters() if not k.startswith("groups.conv1")]
    train(model, torch.randn(40, 1, 28, 28), torch.randint(0, 10, (40,)), TrainArgs(epochs=1), params=params)
    for k, v in frozen.items():
        if "running" not in k and "num_batches" not in k:
            assert torch.equal(model.state_dict()[k], v), k


@pytest.mark.parametrize("weight_decay", [0.0, 1e-3])
def test_plain_adam_matches_torch_adam_bit_for_bit(weight_decay: float, monkeypatch) -> None:
    """torch.optim.Adam's update with correctly rounded square roots (torch's own take the last bit
    from the CPU's MKL path; PlainAdam's do not, so its numbers are the same on every CPU)."""
    monkeypatch.setattr(torch.Tensor, "sqrt", exact_sqrt)
    torch.manual_seed(0)
    a = build_model("lenet5", (1, 28, 28), 10, seed=1)
    b = build_model("lenet5", (1, 28, 28), 10, seed=1)
    ours = PlainAdam(a.parameters(), lr=1e-3, weight_decay=weight_decay)
    ref = torch.optim.Adam(b.parameters(), lr=1e-3, weight_decay=weight_decay, foreach=False)
    assert_same_steps(a, ours, b, ref, steps=5)


def test_plain_adam_state_resumes_in_either_optimizer(monkeypatch) -> None:
    """PlainAdam's state_dict is torch.optim.Adam's: a checkpoint written before FedGKT's server
    took PlainAdam resumes into it, and the other way round; both go on bit for bit."""
    monkeypatch.setattr(torch.Tensor, "sqrt", exact_sqrt)
    torch.manual_seed(0)
    a = build_model("lenet5", (1, 28, 28), 10, seed=1)
    b = build_model("lenet5", (1, 28, 28), 10, seed=1)
    ref = torch.optim.Adam(b.parameters(), lr=1e-3, foreach=False)
    ours = PlainAdam(a.parameters(), lr=5.0)  # lr and moments come from the loaded state
    assert_same_steps(a, PlainAdam(a.parameters(), lr=1e-3), b, ref, steps=2)
    ours.load_state_dict(ref.state_dict())
    assert ours.lr == 1e-3 and ours.steps == [2] * len(ours.params)
    assert_same_steps(a, ours, b, ref, steps=2)
    again = torch.optim.Adam(b.parameters(), lr=5.0, foreach=False)
    again.load_state_dict(ours.state_dict())
    assert_same_steps(a, ours, b, again, steps=2)


def test_plain_adam_refuses_another_models_state() -> None:
    small = PlainAdam([torch.nn.Parameter(torch.ones(3))], lr=0.1)
    with pytest.raises(ValueError, match="belongs to another model"):
        PlainAdam(build_model("lenet5", (1, 28, 28), 10, seed=1).parameters(), lr=0.1).load_state_dict(
            small.state_dict()
        )


def test_exact_sqrt_is_correctly_rounded() -> None:
    """Against Python's math.sqrt (correctly rounded in double) rounded to float32 through numpy."""
    import math

    import numpy as np

    x = torch.rand(20000, generator=torch.Generator().manual_seed(0)) * torch.logspace(-12, 6, 20000)
    want = np.array([math.sqrt(float(v)) for v in x], dtype=np.float64).astype(np.float32)
    assert np.array_equal(exact_sqrt(x).numpy(), want)


def test_fixed_steps_reshuffle_when_the_data_runs_out_and_skip_single_samples() -> None:
    g = torch.Generator().manual_seed(0)
    batches = list(batch_indices(10, TrainArgs(batch_size=4, steps=7), g))
    assert len(batches) == 7 and all(len(b) in (4, 2) for b in batches)  # 4, 4, 2 per pass of 10
    passes = [torch.cat(batches[i : i + 3]).sort().values for i in (0, 3)]
    assert all(torch.equal(p, torch.arange(10)) for p in passes)  # each pass visits every sample once
    assert not torch.equal(torch.cat(batches[0:3]), torch.cat(batches[3:6]))  # ... in a new order
    odd = list(batch_indices(9, TrainArgs(batch_size=4, steps=5), torch.Generator().manual_seed(0)))
    assert len(odd) == 5 and all(len(b) == 4 for b in odd)  # the 1-sample tail is skipped and not counted
    assert list(batch_indices(1, TrainArgs(steps=3), g)) == []  # nothing to train on: no endless loop


def test_epoch_batches_are_the_old_loop_exactly() -> None:
    """Epoch mode keeps the RNG stream of every committed run: one randperm per epoch."""
    a = list(batch_indices(70, TrainArgs(batch_size=32, epochs=2), torch.Generator().manual_seed(3)))
    g = torch.Generator().manual_seed(3)
    b = [
        o[s : s + 32]
        for o in (torch.randperm(70, generator=g) for _ in range(2))
        for s in range(0, 70, 32)
        if len(o[s : s + 32]) >= 2
    ]
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_train_with_adam_and_steps_lowers_the_loss() -> None:
    torch.manual_seed(0)
    model = build_model("lenet5", (1, 28, 28), 10, seed=0)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    first = train(model, x, y, TrainArgs(steps=5, batch_size=16, lr=1e-3, optimizer="adam"))
    later = train(model, x, y, TrainArgs(steps=40, batch_size=16, lr=1e-3, optimizer="adam"))
    assert later < first
    with pytest.raises(ValueError, match="optimizer"):
        TrainArgs(optimizer="lbfgs")


def test_learning_rate_schedules() -> None:
    multistep = LRSchedule("multistep", (0.4, 0.7), 0.1, rounds=100)  # the Felo/Velo paper: x0.1 at 40 % and 70 %
    assert multistep.milestone_rounds() == [40, 70]
    assert [multistep.lr(1e-3, r) for r in (1, 40, 41, 70, 71, 100)] == pytest.approx(
        [1e-3, 1e-3, 1e-4, 1e-4, 1e-5, 1e-5]
    )
    exponential = LRSchedule("exponential", gamma=0.95)  # the FedTSDP paper: 0.05 * 0.95^(r-1)
    assert exponential.lr(0.05, 1) == 0.05 and exponential.lr(0.05, 3) == pytest.approx(0.05 * 0.95**2)
    assert LRSchedule().lr(0.01, 50) == 0.01
    assert LRSchedule("multistep", (5,), 0.5).lr(1.0, 6) == 0.5  # a round number needs no total
    with pytest.raises(ValueError, match="kind"):
        LRSchedule("cosine")
    with pytest.raises(ValueError, match="rounds"):
        LRSchedule("multistep", (0.5,))
    with pytest.raises(ValueError, match="no key"):
        LRSchedule.from_config({"kind": "constant", "step": 3})


def test_a_passed_optimizer_keeps_its_state_from_call_to_call() -> None:
    """train(optimizer=...) uses the caller's optimizer (a persistent client's), so its step
    counts run on; without one each call starts a fresh optimizer."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    args = TrainArgs(batch_size=5, steps=3, optimizer="adam", lr=1e-2)
    kept = PlainAdam(model.parameters(), lr=1e-2)
    train(model, x, y, args, generator=torch.Generator().manual_seed(1), optimizer=kept)
    train(model, x, y, args, generator=torch.Generator().manual_seed(2), optimizer=kept)
    assert kept.steps == [6, 6]
