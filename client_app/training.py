"""Local training and evaluation loops shared by every client role.

Roles change *what* is optimised (which parameters, which extra loss terms, what is
recorded per batch) through arguments, never by copying the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

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


class PlainSGD:
    """SGD with momentum and weight decay: the update of ``torch.optim.SGD`` (no dampening,
    no Nesterov), bit for bit.

    Why not ``torch.optim.SGD``: its first use in a process imports ``torch._dynamo``, seconds
    of start-up (docs/benchmarks.md, section 1). Every new ClientApp process pays that: once per Ray actor in
    simulation, and once per message on a SuperNode (the ClientApp runs in a fresh process
    for each message), where it was most of a small client's round.
    """

    def __init__(
        self, params: Iterable[nn.Parameter], lr: float, momentum: float = 0.0, weight_decay: float = 0.0
    ) -> None:
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not live:
            return
        bufs = sgd_update(
            [self.params[i] for i in live],
            [self.params[i].grad for i in live],
            [self.buffers[i] for i in live],
            self.lr,
            self.momentum,
            self.weight_decay,
        )
        for i, buf in zip(live, bufs):
            self.buffers[i] = buf


@torch.no_grad()
def sgd_update(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    buffers: list[torch.Tensor | None],
    lr: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
) -> list[torch.Tensor | None]:
    """:class:`PlainSGD`'s update of ``params`` in place, given their gradients and momentum
    buffers (None: the first step, where the buffer starts as the direction itself); returns the
    buffers after the step. d = g + wd p; buf = m buf + d; p -= lr buf. The batched engine calls
    it on stacked parameters (one row per client): the same arithmetic, element by element.

    One multi-tensor (``torch._foreach_*``) call per operation instead of a Python loop over the
    tensors: one kernel launch per op on a GPU; on CPU the same per-tensor arithmetic."""
    d_p = torch._foreach_add(grads, params, alpha=weight_decay) if weight_decay != 0 else list(grads)
    if momentum != 0:
        old = [j for j, b in enumerate(buffers) if b is not None]
        if old:
            bufs = [buffers[j] for j in old]
            torch._foreach_mul_(bufs, momentum)
            torch._foreach_add_(bufs, [d_p[j] for j in old])
        buffers = [b if b is not None else torch.clone(d_p[j]).detach() for j, b in enumerate(buffers)]
        d_p = buffers
    torch._foreach_add_(params, d_p, alpha=-lr)
    return list(buffers)


def exact_sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root of a float32 tensor: computed in float64 and rounded
    once (exact for float32, whose square roots are never near a rounding midpoint).

    Why not ``torch.sqrt``: with MKL, ATen takes a float tensor's square root from MKL's vector
    library, whose last bit depends on the CPU (an Intel Xeon with AVX-512 and the AVX2 path
    differ), so Adam's updates, and every later number of a run, moved from one machine to the
    next; float64 square roots round to the same float32 on every CPU (checked against an
    emulated AVX2 CPU)."""
    return torch.sqrt(x.double()).to(x.dtype) if x.dtype == torch.float32 else torch.sqrt(x)


class PlainAdam:
    """Adam (Kingma & Ba; L2 ``weight_decay`` added to the gradient): the update of
    ``torch.optim.Adam`` on CPU (its single-tensor path), bit for bit where that takes correctly
    rounded square roots (:func:`exact_sqrt`; torch's own depend on the CPU), without importing
    ``torch._dynamo`` (see :class:`PlainSGD`)."""

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        self.params = list(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.step_count = 0
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.steps = [0] * len(self.params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        beta1, beta2 = self.betas
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not live:
            return
        params = [self.params[i] for i in live]
        grads = [self.params[i].grad for i in live]
        exp_avg = [self.exp_avg[i] for i in live]
        exp_avg_sq = [self.exp_avg_sq[i] for i in live]
        for i in live:
            self.steps[i] += 1
        if self.weight_decay != 0:
            grads = torch._foreach_add(grads, params, alpha=self.weight_decay)
        torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sq, beta2)
        torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
        denom = [exact_sqrt(v) for v in exp_avg_sq]
        torch._foreach_div_(denom, [(1 - beta2 ** self.steps[i]) ** 0.5 for i in live])
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(params, exp_avg, denom, [-(self.lr / (1 - beta1 ** self.steps[i])) for i in live])


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
) -> float:
    """Mini-batch training over shuffled (x, y) (:func:`batch_indices`); returns the mean batch loss.

    Only ``params`` are updated (all parameters if None); others keep their values. The
    optimizer (``args.optimizer``) is fresh every call: its state never outlives a round.
    """
    device = device or next(model.parameters()).device
    trainable = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
    if not trainable or (args.epochs <= 0 if args.steps is None else args.steps <= 0):
        return float("nan")
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
