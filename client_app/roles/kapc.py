"""KAPC's client side (KAPC paper, algorithm): coached local training and BLS's upload choice.

The client trains its own model (kept across rounds) on CE + lambda * sum_l ||w^l - target^l||^2:
the target of layer l is the server's regularizer s_i^l (extra arrays ``s/<key>``, never loaded
into the model) when the server sent it, else the client's own round-start layer (``masked_reg``
"start"; "none" leaves a layer not sent out of the sum). That is the proximal term with mu = 2
lambda (the proximal term carries a 1/2, the paper's does not).
With BLS the client then picks how many leading layers to upload, Omega, by the
generalization-bound rule of ALG4 in log space (KAPC paper): plain functions of the layers' norms,
distances and shapes, unit-tested by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.models.schema import layer_dims, parameter_layers
from pflower.protocol import options
from pflower.protocol.role_args import RoleArgs, RoleArgsError

from ..training import TrainArgs
from .base import FitPlan, Role, RoleContext
from .proximal import proximal_terms, snapshot

STATE = "kapc."  # extra_state keys: kapc.bmax, kapc.tmax (running maxima per layer), kapc.omega (Omega_prev)
FLOOR = 1e-12


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def log_bound(
    omega: int, d: Sequence[int], n: Sequence[int], b: Sequence[float], tau: Sequence[float], classes: int | None = None
) -> float:
    """log of the per-layer generalization term of the first ``omega`` layers (Eq. 29):
    log(d^Omega) + Omega log 2 + sum_{l<=Omega} log B^l + logsumexp_l[log tau^l - log 2B^l +
    1/2 sum_{p=l+1..Omega} log n^p] - log Omega. With ``classes`` (Omega = L, the full bound) c
    replaces d^L. rho, A, m, delta and (b - a) cancel in the comparison."""
    logs_b = [math.log(max(x, FLOOR)) for x in b[:omega]]
    logs_n = [math.log(max(x, 1)) for x in n[:omega]]
    terms = [
        math.log(max(tau[l], FLOOR)) - math.log(2 * max(b[l], FLOOR)) + 0.5 * sum(logs_n[l + 1 : omega])
        for l in range(omega)
    ]
    head = math.log(classes if classes is not None else d[omega - 1])
    return head + omega * math.log(2.0) + sum(logs_b) + _logsumexp(terms) - math.log(omega)


def criterion(omega: int, d, n, b_hat, tau_hat, b_full, tau_full, classes: int) -> bool:
    """Definition 1: uploading ``omega`` layers has the smaller per-layer generalization gap (Eq. 29)."""
    layers = len(d)
    return log_bound(omega, d, n, b_hat, tau_hat) < log_bound(layers, d, n, b_full, tau_full, classes)


def select_omega(
    d: Sequence[int],
    n: Sequence[int],
    b_cur: Sequence[float],
    tau_cur: Sequence[float],
    b_max: np.ndarray,
    tau_max: np.ndarray,
    omega_prev: int,
    first: bool,
    omega_min: int,
    classes: int,
) -> tuple[int, bool]:
    """ALG4: (Omega, whether the floor ``omega_min`` stopped the walk down). Updates b_max/tau_max
    in place when this round's regularizer counts as full (first participation or Omega_prev = L)."""
    layers = len(d)
    omega_min = min(max(omega_min, 1), layers)
    if first or omega_prev >= layers:
        np.maximum(b_max, b_cur, out=b_max)
        np.maximum(tau_max, tau_cur, out=tau_max)
        return max(layers - 1, omega_min), False

    def ok(omega: int) -> bool:
        return criterion(omega, d, n, b_cur, tau_cur, b_max, tau_max, classes)

    omega = min(max(omega_prev, omega_min), layers)
    if ok(omega):
        while omega - 1 >= omega_min and ok(omega - 1):
            omega -= 1
        return omega, omega == omega_min and omega_min > 1 and ok(omega_min - 1)
    while omega < layers and not ok(omega):
        omega += 1
    return omega, False


REGULARIZER_PREFIX = "s/"  # the regularizer s_i travels as extra arrays "s/<key>" (never loaded into the model)
KAPC_MASKED_REGS = ("start", "none")  # what a layer the server did not send is pulled toward


@dataclass(frozen=True)
class KAPCArgs(RoleArgs):
    """KAPC's client (KAPC paper, algorithm): its own model trained on CE + lam * sum_l ||w^l -
    target^l||^2, the target being the server's s_i^l where ``mask[l]`` is 1 (all layers when
    empty). A layer not sent is pulled toward the client's own round-start layer (``masked_reg``
    "start") or trains on CE alone ("none"). ``bls``: the upload prefix Omega is chosen by the
    generalization-bound rule (ALG4), at least ``omega_min`` layers."""

    lam: float = options.option(1.0, "coaching weight lambda (the paper at alpha 0.1: 1)", low=0)
    omega_min: int | None = options.option(
        None, "BLS uplink floor on Omega (null: L - 2, the calibrated guard; 1: the literal rule)", low=1
    )
    masked_reg: str = options.option(
        "start",
        "what a layer the server does not send (BLS mask, unheard, after Omega) is pulled toward: start (the "
        "client's own round-start layer, a proximal term with weight lambda) or none (no pull: it trains on CE alone)",
        choices=KAPC_MASKED_REGS,
    )
    bls: bool = options.sent(False, "bidirectional layer selection: the method's (KAPC-BLS)")
    mask: list[int] = options.sent([], "per layer, 1 where s_i^l was sent (empty: every layer)")
    first: bool = options.sent(False, "the client's first participation")

    def __post_init__(self) -> None:
        super().__post_init__()
        if any(m not in (0, 1) for m in self.mask):
            raise RoleArgsError(f"KAPC mask must hold 0/1 per layer, got {self.mask}", "mask")


class KAPCRole(Role):
    name = "kapc"
    args_type = KAPCArgs

    def plan(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> FitPlan:
        """CE + lambda ||w - target||^2 (the proximal penalty with mu = 2 lambda), then with BLS
        the upload choice Omega from the trained layers."""
        layers = parameter_layers(model)
        mask = list(self.args.mask) or [1] * len(layers)
        if len(mask) != len(layers):
            raise ValueError(f"KAPC mask has {len(mask)} layers, this model {len(layers)}")
        start = snapshot(model)
        targets: dict[str, torch.Tensor] = {}
        for sent, keys in zip(mask, layers):
            for k in keys:
                if sent and REGULARIZER_PREFIX + k not in ctx.received_extra:
                    raise ValueError(f"KAPC: the server sent no regularizer for {k}")
                targets[k] = ctx.received_extra[REGULARIZER_PREFIX + k].to(ctx.device) if sent else start[k]
        # lambda ||w - s||^2 = (2 lambda)/2 ||w - s||^2; with masked_reg "none" the layers not sent train on CE
        # alone (their round-start target still stands in for s in the bound's tau, Eq. 20's convention)
        pulled = (
            targets
            if self.args.masked_reg == "start"
            else {k: targets[k] for sent, keys in zip(mask, layers) if sent for k in keys}
        )
        mu = 2.0 * self.args.lam

        def choose_upload(trained: nn.Module) -> dict[str, float]:
            metrics = {"omega": float(len(layers)), "masked_layers": float(len(mask) - sum(mask))}
            if self.args.bls:
                omega, floor, reset = self._omega(trained, layers, targets, data.num_classes, ctx)
                keep = {k for keys in layers[:omega] for k in keys}
                ctx.upload_keys = [k for k in ctx.upload_keys if k in keep]
                # who chose Omega: ALG4's reset to L - 1 (first participation or Omega_prev = L), the
                # floor omega_min, or else the bound
                metrics.update({"omega": float(omega), "omega_floor": float(floor), "omega_reset": float(reset)})
            return metrics

        terms = proximal_terms(mu) if pulled else ()  # nothing to pull toward: CE alone
        return FitPlan(penalty=terms, reference=pulled if terms else {}, after=choose_upload)

    def _omega(self, model: nn.Module, layers, targets, classes: int, ctx: RoleContext) -> tuple[int, bool, bool]:
        """(Omega, whether the floor stopped the walk, whether ALG4 reset it to L - 1 untested)."""
        params = dict(model.named_parameters())
        weights = [params[keys[0]].detach() for keys in layers]  # the bound reads each layer's weight matrix
        b_cur = [float(w.norm()) for w in weights]
        tau_cur = [float((w - targets[keys[0]]).norm()) for w, keys in zip(weights, layers)]
        dims = layer_dims(model, layers)
        state = ctx.extra_state
        b_max = state.get(STATE + "bmax", torch.zeros(len(layers), dtype=torch.float64)).numpy().copy()
        tau_max = state.get(STATE + "tmax", torch.zeros(len(layers), dtype=torch.float64)).numpy().copy()
        prev = int(state.get(STATE + "omega", torch.tensor([len(layers)])).item())
        omega, floor = select_omega(
            [d for d, _ in dims],
            [n for _, n in dims],
            b_cur,
            tau_cur,
            b_max,
            tau_max,
            prev,
            self.args.first,
            self.args.omega_min,
            classes,
        )
        state.update(
            {
                STATE + "bmax": torch.from_numpy(b_max),
                STATE + "tmax": torch.from_numpy(tau_max),
                STATE + "omega": torch.tensor([omega]),
            }
        )
        return omega, floor, bool(self.args.first or prev >= len(layers))  # select_omega's reset condition
