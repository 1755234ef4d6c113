"""The one training loop's optimizer: torch.optim.SGD's update without importing torch._dynamo."""

import subprocess
import sys

import pytest
import torch

from client_app.training import PlainSGD, TrainArgs, train
from models import build_model


@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.0, 5e-4), (0.5, 1e-3)])
def test_plain_sgd_matches_torch_sgd_bit_for_bit(momentum: float, weight_decay: float) -> None:
    torch.manual_seed(0)
    a = build_model("lenet5", (1, 28, 28), 10, seed=1)
    b = build_model("lenet5", (1, 28, 28), 10, seed=1)
    ours = PlainSGD(a.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay)
    ref = torch.optim.SGD(b.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay)
    for _ in range(4):
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


def test_training_does_not_import_dynamo() -> None:
    """The first torch.optim use costs ~3 s of import in every fresh ClientApp process."""
    code = (
        "import sys, torch\n"
        "from client_app.training import TrainArgs, train\n"
        "from models import build_model\n"
        "m = build_model('lenet5', (1, 28, 28), 10, seed=0)\n"
        "train(m, torch.randn(40, 1, 28, 28), torch.randint(0, 10, (40,)), TrainArgs(epochs=1, momentum=0.9))\n"
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
