"""Optimizers whose updates are the same bits on every CPU: SGD and Adam as ``torch.optim`` computes
them, written out so that (1) a ClientApp process never imports ``torch._dynamo`` (which
``torch.optim``'s first use does: seconds of start-up) and (2) Adam's square root is correctly
rounded (:func:`exact_sqrt`). Client training and the servers that train a model of their own
(Velo's CVAE, FedGKT's server model) use them, so a run's numbers do not depend on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import torch
from torch import nn


class Optimizer(Protocol):
    """What a training loop calls: ``torch.optim``'s optimizers, :class:`PlainSGD` and :class:`PlainAdam`."""

    def zero_grad(self) -> None: ...

    def step(self) -> None: ...


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

    def moments(self) -> list[dict[str, torch.Tensor]]:
        """Each parameter's momentum buffer (``{}`` before its first step, or without momentum):
        what a client keeps between rounds with ``optimizer_state=kept``."""
        return [{} if b is None else {"momentum_buffer": b} for b in self.buffers]

    def load_moments(self, moments: list[dict[str, torch.Tensor]]) -> None:
        """Inverse of :meth:`moments` (``{}``: the parameter starts afresh)."""
        self.buffers = [m["momentum_buffer"].to(p).clone() if m else None for p, m in zip(self.params, moments)]

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
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.steps = [0] * len(self.params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_dict(self) -> dict[str, Any]:
        """``torch.optim.Adam``'s layout (a parameter's moments once it has stepped), so that a
        checkpoint written by either optimizer resumes into the other. Copies: an optimizer that
        loads them (torch's keeps the tensors it is given) does not share the moments with this one."""
        state = {
            i: {
                "step": torch.tensor(float(n)),
                "exp_avg": self.exp_avg[i].clone(),
                "exp_avg_sq": self.exp_avg_sq[i].clone(),
            }
            for i, n in enumerate(self.steps)
            if n > 0
        }
        group = {"lr": self.lr, "betas": self.betas, "eps": self.eps, "weight_decay": self.weight_decay}
        return {"state": state, "param_groups": [{**group, "params": list(range(len(self.params)))}]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError(
                f"the optimizer state is for {[len(g['params']) for g in groups]} parameters in "
                f"{len(groups)} group(s), this Adam has {len(self.params)} in one: it belongs to another model"
            )
        if groups[0].get("amsgrad") or groups[0].get("maximize"):
            raise ValueError("the optimizer state is of Adam with amsgrad or maximize, which PlainAdam does not run")
        group = groups[0]
        self.lr, self.eps, self.weight_decay = group["lr"], group["eps"], group["weight_decay"]
        self.betas = (float(group["betas"][0]), float(group["betas"][1]))
        saved = {int(k): v for k, v in state_dict["state"].items()}
        for i, p in enumerate(self.params):
            s = saved.get(i)
            self.steps[i] = int(s["step"]) if s else 0
            self.exp_avg[i] = s["exp_avg"].to(p).clone() if s else torch.zeros_like(p)
            self.exp_avg_sq[i] = s["exp_avg_sq"].to(p).clone() if s else torch.zeros_like(p)

    def moments(self) -> list[dict[str, torch.Tensor]]:
        """Each parameter's moments and step count (``{}`` before its first step): what a client
        keeps between rounds with ``optimizer_state=kept``."""
        return [
            {"exp_avg": m, "exp_avg_sq": v, "step": torch.tensor(n, dtype=torch.int64)} if n > 0 else {}
            for m, v, n in zip(self.exp_avg, self.exp_avg_sq, self.steps)
        ]

    def load_moments(self, moments: list[dict[str, torch.Tensor]]) -> None:
        """Inverse of :meth:`moments` (``{}``: the parameter starts afresh)."""
        for i, (p, m) in enumerate(zip(self.params, moments)):
            self.steps[i] = int(m["step"]) if m else 0
            self.exp_avg[i] = m["exp_avg"].to(p).clone() if m else torch.zeros_like(p)
            self.exp_avg_sq[i] = m["exp_avg_sq"].to(p).clone() if m else torch.zeros_like(p)

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
