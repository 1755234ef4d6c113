"""client_app.grouped_training.train_together: many clients' training as one computation equals training
them one at a time (client_app.training.train) to float rounding, on inputs without ties."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
from torch import nn

from pflower.client_app.grouped_training import NotBatchable, train_together
from pflower.client_app.roles.base import FitPlan
from pflower.client_app.roles.proximal import proximal_penalty, snapshot
from pflower.client_app.training import TrainArgs, train
from pflower.models import build_model

RTOL = 1e-5  # of a tensor's largest magnitude, after at most two epochs


def clients(sizes: list[int], seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)) for n in sizes]


def perturbed_copies(model: nn.Module, count: int) -> list[nn.Module]:
    """Clients start from different weights (personal layers, earlier rounds)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(count):
        m = copy.deepcopy(model)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=g))
        out.append(m)
    return out


def both(models, data, plans, args):  # noqa: ANN001, ANN201
    """(one at a time, together): the trained models and their returned losses."""
    alone = [copy.deepcopy(m) for m in models]
    losses = []
    for k, (m, d, plan) in enumerate(zip(alone, data, plans)):
        params = None if plan.params is None else [p for n, p in m.named_parameters() if n in set(plan.params)]
        losses.append(
            train(m, *d, args, params=params, loss_fn=plan.loss_fn(), generator=torch.Generator().manual_seed(k))
        )
    together = [copy.deepcopy(m) for m in models]
    generators = [torch.Generator().manual_seed(k) for k in range(len(models))]
    return alone, losses, together, train_together(together, data, plans, args, generators, torch.device("cpu"))


def assert_close(alone: list[nn.Module], together: list[nn.Module]) -> None:
    for a, b in zip(alone, together):
        for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
            if x.dtype.is_floating_point:
                assert (x - y).abs().max() <= RTOL * max(float(x.abs().max()), 1e-6), name
            else:  # BatchNorm's num_batches_tracked: each client's own step count
                assert torch.equal(x, y), name


@pytest.fixture(scope="module")
def lenet() -> nn.Module:
    return build_model("lenet5", (1, 28, 28), 10, seed=3)


def test_uneven_clients_with_momentum_and_weight_decay(lenet):
    """Sizes give unequal step counts, last batches of other sizes, a client with no step (one
    sample: batches of one are skipped) and one smaller than a batch."""
    sizes = [1, 5, 33, 64, 100]
    models = perturbed_copies(lenet, len(sizes))
    args = TrainArgs(epochs=2, batch_size=32, lr=0.05, momentum=0.9, weight_decay=1e-3)
    alone, losses, together, batched = both(models, clients(sizes), [FitPlan() for _ in sizes], args)
    assert_close(alone, together)
    assert batched[0] == losses[0] == 0.0  # no step: the loop's empty mean
    assert batched == pytest.approx(losses, rel=1e-6)


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_a_proximal_penalty_toward_each_clients_own_reference(lenet):
    sizes = [40, 70, 33]
    models = perturbed_copies(lenet, len(sizes))
    refs = perturbed_copies(lenet, len(sizes))[::-1]  # a reference other than the start
    plans = [FitPlan(penalty=partial(proximal_penalty, mu=0.5), reference=snapshot(r)) for r in refs]
    alone, losses, together, batched = both(models, clients(sizes), plans, TrainArgs(epochs=1, lr=0.05))
    assert_close(alone, together)
    assert batched == pytest.approx(losses, rel=1e-6)
    # the penalty acted: without it the result differs by more than the tolerance
    plain = [copy.deepcopy(m) for m in models]
    train_together(
        plain,
        clients(sizes),
        [FitPlan() for _ in sizes],
        TrainArgs(epochs=1, lr=0.05),
        [torch.Generator().manual_seed(k) for k in range(3)],
        torch.device("cpu"),
    )
    assert (
        dict(plain[0].named_parameters())["groups.fc1.0.weight"]
        - dict(together[0].named_parameters())["groups.fc1.0.weight"]
    ).abs().max() > 1e-4


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_only_the_planned_parameters_train(lenet):
    """FedBABU's plan: the body trains, the head keeps its values bit for bit."""
    models = perturbed_copies(lenet, 2)
    body = [n for n, _ in lenet.named_parameters() if not n.startswith("groups.classifier.")]
    alone, _, together, _ = both(models, clients([50, 45]), [FitPlan(params=body)] * 2, TrainArgs(epochs=1, lr=0.05))
    assert_close(alone, together)
    for m, t in zip(models, together):
        assert torch.equal(m.groups.classifier.weight, t.groups.classifier.weight)
        assert not torch.equal(m.groups.fc1[0].weight, t.groups.fc1[0].weight)


def test_what_cannot_run_as_one_computation_leaves_the_models_untouched(lenet):
    models = perturbed_copies(lenet, 2)
    before = [copy.deepcopy(m.state_dict()) for m in models]
    gens = [torch.Generator().manual_seed(k) for k in range(2)]
    with pytest.raises(NotBatchable, match="optimizer 'adam'"):
        train_together(
            models, clients([40, 40]), [FitPlan()] * 2, TrainArgs(optimizer="adam"), gens, torch.device("cpu")
        )
    dropout = [nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(784, 10)) for _ in range(2)]
    with pytest.raises(NotBatchable, match="vmap"):
        train_together(dropout, clients([40, 40]), [FitPlan()] * 2, TrainArgs(), gens, torch.device("cpu"))
    for m, sd in zip(models, before):
        assert all(torch.equal(v, m.state_dict()[k]) for k, v in sd.items())


def test_stage_metrics_name_each_stages_loss_and_pick_train_loss():
    from pflower.client_app.roles.base import FitPlan, stage_metrics

    nan = float("nan")
    head, body = FitPlan(loss_name="head_loss"), FitPlan(loss_name="body_loss")
    assert stage_metrics([head, body], [0.5, 0.25]) == {"head_loss": 0.5, "body_loss": 0.25, "train_loss": 0.25}
    assert stage_metrics([head, body], [0.5, nan]) == {"head_loss": 0.5, "train_loss": 0.5}  # 0 body epochs
    assert stage_metrics([head, body], [nan, nan]) == {"train_loss": 0.0}
    personal = FitPlan(loss_name="personal_loss")
    assert stage_metrics([personal, FitPlan()], [0.75, 0.125]) == {"personal_loss": 0.75, "train_loss": 0.125}
    got = stage_metrics([personal, FitPlan()], [0.75, nan])  # the stage named train_loss: as it came
    assert got["personal_loss"] == 0.75 and got["train_loss"] != got["train_loss"]


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_evaluate_together_equals_evaluating_each_model_alone():
    """Uneven test sets (one longer than a batch, one without a sample of some class), three
    clients of one architecture and one of another, BatchNorm in eval mode (running statistics
    moved by a training step first, so eval differs from train mode)."""
    from pflower.client_app.grouped_training import evaluate_together
    from pflower.client_app.training import evaluate

    lenet = build_model("lenet5", (1, 28, 28), 10, seed=3)
    models = perturbed_copies(lenet, 3)
    data = clients([300, 7, 64, 5], seed=3)
    args = TrainArgs(epochs=1, batch_size=32, lr=0.01, momentum=0.0, weight_decay=0.0)
    for m, d in zip(models, data):  # running statistics of its own
        train(m, *d, args, generator=torch.Generator().manual_seed(0))
    other = build_model("lenet5", (1, 28, 28), 10, seed=4, fc_layers=1)
    models.append(other)
    was = [m.training for m in models]
    got = evaluate_together(models, data, torch.device("cpu"), batch_size=256)
    for m, d, (correct, loss_sum, n) in zip(models, data, got):
        want_correct, want_loss, want_n = evaluate(m, *d, batch_size=256)
        assert (correct, n) == (want_correct, want_n)
        assert loss_sum == pytest.approx(want_loss, rel=1e-5)
    assert [m.training for m in models] == was  # modes left as they were
