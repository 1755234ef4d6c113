"""Local training and evaluation loops shared by every client role.

Roles change *what* is optimised (which parameters, which extra loss terms, what is
recorded per batch) through arguments, never by copying the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from pflower.models.optim import Optimizer, PlainAdam, PlainSGD
from pflower.protocol.wire import OPTIMIZERS

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TrainArgs:
    """Local training of one round. ``steps``: a fixed number of mini-batch steps (reshuffling
    when the data runs out, Felo/Velo) instead of ``epochs`` passes. ``lr`` is this round's rate
    (the server applies the run's schedule). ``optimizer``: ``sgd`` (with ``momentum`` and
    ``weight_decay``) or ``adam`` (betas 0.9/0.999, eps 1e-8, ``weight_decay`` as L2)."""

    epochs: int = 5
    batch_size: int = 32
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    optimizer: str = "sgd"
    steps: int | None = None

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
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
) -> float:
    """Mini-batch training over shuffled (x, y) (:func:`batch_indices`); returns the mean batch loss.

    Only ``params`` are updated (all parameters if None); others keep their values. The
    optimizer (``args.optimizer``) is fresh every call, so its state never outlives a round,
    unless the caller passes one of its own (``optimizer``, already over the parameters to train,
    at this round's rate): then its state runs on from call to call, as a persistent client's does.
    """
    device = device or next(model.parameters()).device
    trainable = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
    if not trainable or (args.epochs <= 0 if args.steps is None else args.steps <= 0):
        return float("nan")
    if optimizer is None:
        optimizer = make_optimizer(trainable, args)
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
