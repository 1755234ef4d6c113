"""Local training and evaluation loops shared by every client role.

Roles change *what* is optimised (which parameters, which extra loss terms, what is
recorded per batch) through arguments, never by copying the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass

import torch
from torch import nn

from pflower.models.optim import Optimizer, PlainAdam, PlainSGD
from pflower.protocol.wire import OPTIMIZER_STATES, OPTIMIZERS

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TrainArgs:
    """Local training of one round. ``steps``: a fixed number of mini-batch steps (reshuffling
    when the data runs out, Felo/Velo) instead of ``epochs`` passes. ``lr`` is this round's rate
    (the server applies the run's schedule). ``optimizer``: ``sgd`` (with ``momentum`` and
    ``weight_decay``) or ``adam`` (betas 0.9/0.999, eps 1e-8, ``weight_decay`` as L2).
    ``optimizer_state``: ``fresh`` builds the optimizer anew every round; ``kept`` carries its
    moments (and Adam's step count) from the client's previous round (:func:`train`'s ``kept``)."""

    epochs: int = 5
    batch_size: int = 32
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    optimizer: str = "sgd"
    steps: int | None = None
    optimizer_state: str = "fresh"

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.optimizer_state not in OPTIMIZER_STATES:
            raise ValueError(f"optimizer_state must be one of {list(OPTIMIZER_STATES)}, got {self.optimizer_state!r}")
        if self.steps is not None and self.steps < 0:
            raise ValueError(f"local steps must be >= 0, got {self.steps}")


def pick_device(preference: str = "auto") -> torch.device:
    """CUDA when present (or asked for), else CPU."""
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(preference)


def make_optimizer(params: list[nn.Parameter], args: TrainArgs) -> PlainSGD | PlainAdam:
    if args.optimizer == "adam":
        return PlainAdam(params, lr=args.lr, weight_decay=args.weight_decay)
    return PlainSGD(params, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)


# keys of a kept optimizer's tensors in a client's role state (RoleContext.extra_state):
# "optim/<slot>/<parameter name>/<exp_avg|exp_avg_sq|step|momentum_buffer>"
OPTIM_STATE = "optim/"


def load_optimizer_state(
    optimizer: PlainSGD | PlainAdam, names: list[str], kept: MutableMapping[str, torch.Tensor], slot: str
) -> None:
    """Give ``optimizer`` (over the parameters ``names``) the moments kept under ``slot``; a
    parameter with none starts afresh. A kept moment of another shape is refused: the client's
    model changed between rounds (HeteroFL's widths), so its old moments do not apply."""
    moments = []
    for name, p in zip(names, optimizer.params):
        prefix = f"{OPTIM_STATE}{slot}/{name}/"
        mine = {k[len(prefix) :]: v for k, v in kept.items() if k.startswith(prefix)}
        for what, t in mine.items():
            if what != "step" and t.shape != p.shape:
                raise ValueError(
                    f"optimizer_state=kept: the kept {what} of parameter {name!r} has shape {tuple(t.shape)}, "
                    f"the parameter now {tuple(p.shape)}: this client's model changed between rounds "
                    "(its optimizer state cannot carry over); run with optimizer_state=fresh"
                )
        moments.append(mine)
    optimizer.load_moments(moments)


def save_optimizer_state(
    optimizer: PlainSGD | PlainAdam, names: list[str], kept: MutableMapping[str, torch.Tensor], slot: str
) -> None:
    """Write ``optimizer``'s moments into ``kept`` under ``slot`` (CPU copies), replacing that
    slot's older entries for these parameters."""
    for name, moments in zip(names, optimizer.moments()):
        prefix = f"{OPTIM_STATE}{slot}/{name}/"
        for key in [k for k in kept if k.startswith(prefix)]:
            del kept[key]
        kept.update({prefix + what: t.detach().cpu().clone() for what, t in moments.items()})


def batch_indices(n: int, args: TrainArgs, generator: torch.Generator | None) -> Iterator[torch.Tensor]:
    """The index batches of one round: ``args.epochs`` shuffled passes, or ``args.steps`` batches
    (reshuffling at the end of each pass). Batches of a single sample are skipped (BatchNorm
    cannot train on them, FedCMD paper, ClientUpdate (Algorithm 1)) and do not count as steps."""
    if args.steps is None:
        for _ in range(args.epochs):
            order = torch.randperm(n, generator=generator)
            for start in range(0, n, args.batch_size):
                idx = order[start : start + args.batch_size]
                if len(idx) >= 2:
                    yield idx
        return
    done = 0
    while done < args.steps and n >= 2:
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, args.batch_size):
            idx = order[start : start + args.batch_size]
            if len(idx) < 2:
                continue
            yield idx
            done += 1
            if done == args.steps:
                return


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


def train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    args: TrainArgs,
    *,
    params: Iterable[nn.Parameter] | None = None,
    loss_fn: LossFn = cross_entropy,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
    optimizer: Optimizer | None = None,
    kept: MutableMapping[str, torch.Tensor] | None = None,
    slot: str = "main",
) -> float:
    """Mini-batch training over shuffled (x, y) (:func:`batch_indices`); returns the mean batch loss.

    Only ``params`` are updated (all parameters if None); others keep their values. The
    optimizer (``args.optimizer``, at this round's ``args.lr``) is fresh every call, so its state
    never outlives a round, unless
    - ``args.optimizer_state`` is ``kept``: its moments are read from and written back to
      ``kept`` (a role passes ``ctx.extra_state``, which the client keeps between rounds) under
      ``slot`` (one per training loop of a round: FedRep's head and body stages differ); or
    - the caller passes an optimizer of its own (already over the parameters to train, at this
      round's rate): its state runs on from call to call.
    """
    device = device or next(model.parameters()).device
    trainable = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
    if not trainable or (args.epochs <= 0 if args.steps is None else args.steps <= 0):
        return float("nan")
    names: list[str] = []
    if optimizer is None:
        optimizer = make_optimizer(trainable, args)
        if args.optimizer_state == "kept":
            if kept is None:
                raise ValueError(
                    "optimizer_state=kept, but this training loop was given no state to keep it in "
                    "(train(..., kept=ctx.extra_state)); run with optimizer_state=fresh, or pass it"
                )
            by_id = {id(p): name for name, p in model.named_parameters()}
            names = [by_id[id(p)] for p in trainable]
            load_optimizer_state(optimizer, names, kept, slot)
    model.train()
    # the client's tensors go to the device once; the loss is summed there (in float64, the same
    # sum as Python floats), so the loop never waits for the GPU until it returns
    x, y = x.to(device), y.to(device)
    total, batches = torch.zeros((), dtype=torch.float64, device=device), 0
    for idx in batch_indices(len(y), args, generator):
        idx = idx.to(device, non_blocking=True)
        xb, yb = x[idx], y[idx]
        optimizer.zero_grad()
        loss = loss_fn(model, xb, yb)
        loss.backward()
        optimizer.step()
        total += loss.detach().double()
        batches += 1
    if names and kept is not None:
        save_optimizer_state(optimizer, names, kept, slot)
    return float(total) / max(batches, 1)


@torch.no_grad()
def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 256, device: torch.device | None = None
) -> tuple[int, float, int]:
    """(correct predictions, summed cross-entropy, samples) on (x, y), in eval mode."""
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    x, y = x.to(device), y.to(device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for start in range(0, len(y), batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        logits = model(xb)
        loss_sum += nn.functional.cross_entropy(logits, yb, reduction="sum").double()
        correct += (logits.argmax(dim=1) == yb).sum()
    model.train(was_training)
    return int(correct), float(loss_sum), len(y)
