"""APFL (Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", 2020): each client
mixes the global model w with a personal model v it keeps, by a weight alpha it learns.

On every batch, at the values before the step (the paper's Algorithm 1, both updates at once):

- w <- w - lr * grad f(w)                    (w is the model FedAvg averages)
- v <- v - lr * grad_v f(v_bar)              (= alpha * grad f(v_bar), by the chain rule)
- alpha <- clip(alpha - lr * (grad_alpha f(v_bar) + alpha_decay * alpha), 0, 1),
  grad_alpha f(v_bar) = <v - w, grad f(v_bar)>

with the personalized model v_bar = alpha * v + (1 - alpha) * w, mixed parameter by parameter
(``mixing=parameters``, the paper; PFLlib evaluates the same mix) or output by output
(``mixing=outputs``: alpha * v(x) + (1 - alpha) * w(x), FL-bench's code). v and alpha live in
``ctx.extra_state`` between rounds; v starts as the first global model the client receives.
``test_before`` and ``test_after`` evaluate v_bar.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from pflower.federated_data import ClientData
from pflower.protocol.options import option
from pflower.protocol.role_args import RoleArgs

from ..training import TrainArgs, batch_indices, load_optimizer_state, make_optimizer, save_optimizer_state
from .base import Role, RoleContext

PREFIX = "apfl.v."  # the personal model's tensors in ctx.extra_state
ALPHA = "apfl.alpha"
MIXINGS = ("parameters", "outputs")


def mixed_parameters(v: dict[str, torch.Tensor], w: dict[str, torch.Tensor], alpha: torch.Tensor) -> dict:
    """alpha * v + (1 - alpha) * w, key by key, with w held fixed (its gradient comes from f(w) alone)."""
    return {k: alpha * v[k] + (1 - alpha) * w[k].detach() for k in v}


def alpha_step(alpha: torch.Tensor, grad: torch.Tensor, lr: float, decay: float) -> torch.Tensor:
    """The paper's alpha update, clipped to [0, 1]; ``decay`` adds ``decay * alpha`` to the
    gradient (the authors' FedTorch code and both peers: 0.02)."""
    return torch.clamp(alpha - lr * (grad + decay * alpha), 0.0, 1.0)


class MixedOutputs(nn.Module):
    """alpha * v(x) + (1 - alpha) * w(x): FL-bench's personalized model."""

    def __init__(self, v: nn.Module, w: nn.Module, alpha: torch.Tensor) -> None:
        super().__init__()
        self.v, self.w, self.alpha = v, w, alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * self.v(x) + (1 - self.alpha) * self.w(x).detach()


@dataclass(frozen=True)
class APFLArgs(RoleArgs):
    """APFL's client: a personal model mixed with the global one by a learned alpha."""

    alpha: float = option(
        0.5, "the mixing weight of the personal model at first contact (FL-bench: 0.5)", low=0, high=1
    )
    adaptive_alpha: bool = option(True, "learn alpha each step (false: alpha stays as given)")
    alpha_decay: float = option(
        0.0, "added alpha * decay to alpha's gradient (the authors' FedTorch code and both peers: 0.02)", low=0
    )
    mixing: str = option(
        "parameters",
        "parameters: v_bar mixes the weights (paper, PFLlib); outputs: the logits (FL-bench)",
        choices=MIXINGS,
    )


class APFLRole(Role):
    """Its own loop: two optimizers (w's and v's) stepping together on every batch, alpha after them."""

    name = "apfl"
    args_type = APFLArgs

    def personal(self, model: nn.Module, ctx: RoleContext) -> tuple[nn.Module, torch.Tensor]:
        """(v, alpha): the kept ones, or on first contact a copy of the received model and ``alpha``."""
        v = copy.deepcopy(model)
        saved = ctx.kept(PREFIX)
        if saved:
            v.load_state_dict(saved)
        alpha = ctx.extra_state.get(ALPHA, torch.tensor(float(self.args.alpha)))
        return v.to(ctx.device), alpha.to(ctx.device, torch.float32).clone()

    def mixed(self, v: nn.Module, w: nn.Module, alpha: torch.Tensor) -> nn.Module:
        """The personalized model v_bar, for evaluation (parameters: a copy of v holding the mix)."""
        if self.args.mixing == "outputs":
            return MixedOutputs(v, w, alpha.detach())
        out = copy.deepcopy(v)
        with torch.no_grad():
            mix = mixed_parameters(dict(v.named_parameters()), dict(w.named_parameters()), alpha)
            for name, p in out.named_parameters():
                p.copy_(mix[name])
        return out

    def fit_alone(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict:
        w, (v, alpha) = model, self.personal(model, ctx)
        args, kept = train_args, train_args.optimizer_state == "kept"
        opt_w = make_optimizer(list(w.parameters()), args)
        opt_v = make_optimizer(list(v.parameters()), args)
        names_w, names_v = [n for n, _ in w.named_parameters()], [n for n, _ in v.named_parameters()]
        if kept:
            load_optimizer_state(opt_w, names_w, ctx.extra_state, "apfl_w")
            load_optimizer_state(opt_v, names_v, ctx.extra_state, "apfl_v")
        x, y = data.x_train.to(ctx.device), data.y_train.to(ctx.device)
        buffers = dict(v.named_buffers())
        w.train(), v.train()
        # the losses summed on the device (float64, as training.train sums): no wait for it each batch
        total_w = torch.zeros((), dtype=torch.float64, device=ctx.device)
        total_p = torch.zeros((), dtype=torch.float64, device=ctx.device)
        batches = 0
        for idx in batch_indices(len(y), args, ctx.generator):
            xb, yb = x[idx.to(ctx.device)], y[idx.to(ctx.device)]
            alpha.requires_grad_(bool(self.args.adaptive_alpha))
            loss_w = nn.functional.cross_entropy(w(xb), yb)
            if self.args.mixing == "outputs":
                logits = alpha * v(xb) + (1 - alpha) * w(xb).detach()
            else:
                mix = mixed_parameters(dict(v.named_parameters()), dict(w.named_parameters()), alpha)
                logits = functional_call(v, {**mix, **buffers}, (xb,))
            loss_p = nn.functional.cross_entropy(logits, yb)
            opt_w.zero_grad()
            opt_v.zero_grad()
            alpha.grad = None
            (loss_w + loss_p).backward()
            opt_w.step()
            opt_v.step()
            if self.args.adaptive_alpha:
                with torch.no_grad():
                    alpha = alpha_step(alpha.detach(), alpha.grad, args.lr, float(self.args.alpha_decay))
            total_w += loss_w.detach().double()
            total_p += loss_p.detach().double()
            batches += 1
        if kept:
            save_optimizer_state(opt_w, names_w, ctx.extra_state, "apfl_w")
            save_optimizer_state(opt_v, names_v, ctx.extra_state, "apfl_v")
        alpha = alpha.detach()
        ctx.keep(PREFIX, v.state_dict())
        ctx.extra_state[ALPHA] = alpha.cpu().clone()
        self._trained = self.mixed(v, w, alpha)
        n = max(batches, 1)
        return {"train_loss": float(total_w) / n, "personal_loss": float(total_p) / n, "alpha": float(alpha)}

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        v, alpha = self.personal(model, ctx)
        return self.mixed(v, model, alpha)

    def trained_model(self, model: nn.Module, ctx: RoleContext) -> nn.Module:
        trained = getattr(self, "_trained", None)
        return self.eval_model(model, None, None, ctx) if trained is None else trained  # type: ignore[arg-type]
