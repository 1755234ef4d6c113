"""``optimizer_state=kept``: a client's local optimizer runs on from its previous round (the
authors' Felo/Velo code keeps one Adam per client for the whole run), kept with the client's
role state, so it survives rounds, engines and a resume like Ditto's personal model does."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pflower.client_app.grouped_training import NotBatchable, train_together
from pflower.client_app.roles.base import FitPlan
from pflower.client_app.training import OPTIM_STATE, TrainArgs, train
from pflower.models import build_model
from pflower.models.optim import PlainAdam, PlainSGD
from pflower.strategies.base.client_spec import client_spec


@pytest.fixture
def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(70, 1, 28, 28, generator=g), torch.randint(0, 10, (70,), generator=g)


def same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_moments_carried_over_continue_the_optimizer_bit_for_bit(kind):
    """Two steps, moments out, a new optimizer with them in, two more steps: the four steps of one
    optimizer (Adam's step count included: its bias correction goes on from step 3)."""
    torch.manual_seed(0)
    a = nn.Linear(4, 3)
    b = copy.deepcopy(a)
    build = (
        (lambda m: PlainAdam(m.parameters(), lr=0.01))
        if kind == "adam"
        else (lambda m: PlainSGD(m.parameters(), lr=0.1, momentum=0.9))
    )
    one = build(a)
    first = build(b)
    x = torch.randn(8, 4)

    def step(model: nn.Module, opt) -> None:
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()

    for _ in range(2):
        step(a, one)
        step(b, first)
    second = build(b)
    second.load_moments(first.moments())
    for _ in range(2):
        step(a, one)
        step(b, second)
    assert same(a, b)
    if kind == "adam":
        assert [m["step"].item() for m in second.moments()] == [4, 4]
    assert all(m == {} for m in build(copy.deepcopy(b)).moments())  # a new optimizer has none


def test_kept_state_makes_rounds_one_optimizer_and_fresh_does_not(data):
    """Three rounds of train() with optimizer_state=kept equal one Adam carried through the three
    calls, bit for bit; fresh rounds differ. The rate is each round's own (a schedule applies)."""
    x, y = data
    kept_model = build_model("lenet5", (1, 28, 28), 10, seed=1)
    carried_model = copy.deepcopy(kept_model)
    fresh_model = copy.deepcopy(kept_model)
    state: dict[str, torch.Tensor] = {}
    carried = PlainAdam(carried_model.parameters(), lr=1e-3)
    for r, lr in enumerate([1e-3, 1e-3, 1e-4]):
        args = TrainArgs(steps=4, batch_size=16, lr=lr, optimizer="adam")
        carried.lr = lr
        train(carried_model, x, y, args, generator=torch.Generator().manual_seed(r), optimizer=carried)
        train(
            kept_model,
            x,
            y,
            TrainArgs(steps=4, batch_size=16, lr=lr, optimizer="adam", optimizer_state="kept"),
            generator=torch.Generator().manual_seed(r),
            kept=state,
        )
        train(fresh_model, x, y, args, generator=torch.Generator().manual_seed(r))
    assert same(kept_model, carried_model)
    assert not same(kept_model, fresh_model)
    names = [n for n, _ in kept_model.named_parameters()]
    assert set(state) == {f"{OPTIM_STATE}main/{n}/{w}" for n in names for w in ("exp_avg", "exp_avg_sq", "step")}
    assert all(state[f"{OPTIM_STATE}main/{n}/step"].item() == 12 for n in names)
    assert all(t.device.type == "cpu" for t in state.values())


def test_slots_and_parameter_subsets_keep_apart(data):
    """Two training loops of one round (FedRep's head and body) each keep their own moments; a
    loop that trains a subset leaves the other parameters' kept moments alone."""
    x, y = data
    model = build_model("lenet5", (1, 28, 28), 10, seed=1)
    head = [p for n, p in model.named_parameters() if n.startswith("groups.classifier.")]
    args = TrainArgs(steps=2, batch_size=16, momentum=0.9, optimizer_state="kept")
    state: dict[str, torch.Tensor] = {}
    train(model, x, y, args, params=head, kept=state, slot="head_loss")
    assert state and all(k.startswith(f"{OPTIM_STATE}head_loss/groups.classifier.") for k in state)
    head_moments = {k: v.clone() for k, v in state.items()}
    train(model, x, y, args, kept=state, slot="body_loss")
    assert all(torch.equal(state[k], v) for k, v in head_moments.items())
    assert any(k.startswith(f"{OPTIM_STATE}body_loss/") for k in state)


def test_kept_state_needs_a_place_and_the_same_shapes(data):
    x, y = data
    args = TrainArgs(steps=2, batch_size=16, optimizer="adam", optimizer_state="kept")
    model = build_model("lenet5", (1, 28, 28), 10, seed=1)
    with pytest.raises(ValueError, match=r"optimizer_state=kept, but this training loop was given no state"):
        train(model, x, y, args)
    state: dict[str, torch.Tensor] = {}
    train(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), x, y, args, kept=state)
    before = dict(state)
    narrower = nn.Sequential(nn.Flatten(), nn.Linear(784, 5))  # HeteroFL: another width this round
    with pytest.raises(ValueError, match=r"parameter '1.weight' has shape \(10, 784\), the parameter now \(5, 784\)"):
        train(narrower, x, y % 5, args, kept=state)
    assert state == before  # nothing kept was lost
    with pytest.raises(ValueError, match=r"optimizer_state must be one of \['fresh', 'kept'\], got 'always'"):
        TrainArgs(optimizer_state="always")


def test_only_kept_travels_and_the_batched_engine_trains_such_clients_one_at_a_time():
    assert "optimizer_state" not in client_spec()["train"]  # a default spec: what older clients read
    assert client_spec(optimizer_state="kept")["train"]["optimizer_state"] == "kept"
    assert TrainArgs(**client_spec(optimizer_state="kept")["train"]).optimizer_state == "kept"
    with pytest.raises(ValueError, match="optimizer_state must be one of"):
        client_spec(optimizer_state="sometimes")
    models = [nn.Sequential(nn.Flatten(), nn.Linear(784, 10)) for _ in range(2)]
    with pytest.raises(NotBatchable, match="optimizer_state 'kept'"):
        train_together(
            models,
            [],
            [FitPlan()] * 2,
            TrainArgs(optimizer_state="kept"),
            [torch.Generator() for _ in models],
            torch.device("cpu"),
        )


def test_a_kept_round_steps_at_its_own_rate_not_the_last_rounds(data):
    """The moments carry over, the rate does not: after a round at lr 0.5, a one-step round at
    lr 0.001 moves no weight by more than a few thousandths (Adam's step is about lr in size);
    at the kept 0.5 it would move them by tenths. No rate is stored in the kept state."""
    x, y = data
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    state: dict[str, torch.Tensor] = {}
    train(model, x, y, TrainArgs(steps=3, lr=0.5, optimizer="adam", optimizer_state="kept"), kept=state)
    before = [p.detach().clone() for p in model.parameters()]
    train(model, x, y, TrainArgs(steps=1, lr=0.001, optimizer="adam", optimizer_state="kept"), kept=state)
    moved = max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before))
    assert 0 < moved < 0.005
    assert not any("lr" in k for k in state)
