"""FedFomo's client side (Zhang et al., ICLR 2021): first-order model optimization.

The client's own model (persisted: every group is personal) and up to M other clients' models
(extra arrays ``<client id>/<key>``) are scored on a validation split carved from the local
training split (its first ``val_ratio``; training then uses the rest). Downloaded model n
gets w_n = (L(own) - L(theta_n)) / ||theta_n - own|| (validation losses); the new model is
own + sum_n w+_n (theta_n - own) with w+ = max(0, w) normalized to sum 1 (own when no w_n > 0).
The raw w_n go back as metrics ``fomo_w_<client id>`` for the server's affinity matrix.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option
from pflower.protocol.role_args import RoleArgs

from ..training import TrainArgs, evaluate, train
from .base import Role, RoleContext
from .proximal import snapshot

EPS = 1e-5  # keeps w_n finite for a downloaded model equal to the own one (FL-bench)


def fomo_weights(own_loss: float, losses: Sequence[float], distances: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(raw w_n, normalized max(0, w_n)) of the downloaded models; the second is all 0 if none helps."""
    raw = (own_loss - np.asarray(losses, dtype=np.float64)) / (np.asarray(distances, dtype=np.float64) + EPS)
    positive = np.maximum(raw, 0.0)
    total = positive.sum()
    return raw, positive / total if total > 0 else positive


def fomo_combine(
    own: Mapping[str, torch.Tensor], others: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]
) -> dict[str, torch.Tensor]:
    """own + sum_n w_n (theta_n - own), per key of ``own``."""
    return {k: v + sum(float(w) * (theta[k] - v) for w, theta in zip(weights, others)) for k, v in own.items()}


def downloaded_models(ctx: RoleContext) -> dict[int, dict[str, torch.Tensor]]:
    """The other clients' models in the message, by client id."""
    out: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in ctx.received_extra.items():
        cid, key = name.split("/", 1)
        out.setdefault(int(cid), {})[key] = tensor.to(ctx.device)
    return out


def distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum(((a[k] - b[k]) ** 2).sum() for k in a)))


FOMO_WEIGHT_METRIC = "fomo_w_"  # a client's raw weight of peer j is metric "fomo_w_<j>"


@dataclass(frozen=True)
class FedFomoArgs(RoleArgs):
    """FedFomo's client: the first ``val_ratio`` of the training split scores the downloaded models."""

    val_ratio: float = option(0.2, "validation share of the local training split", above=0, below=1)


class FedFomoRole(Role):
    name = "fedfomo"
    args_type = FedFomoArgs

    def fit(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict[str, float]:
        n_val = int(float(self.args.val_ratio) * data.num_train)
        x_val, y_val = data.x_train[:n_val], data.y_train[:n_val]
        metrics: dict[str, float] = {}
        others = downloaded_models(ctx)
        if others and n_val > 0:
            own = snapshot(model)
            probe = copy.deepcopy(model)  # the own BN statistics with each downloaded model's parameters
            losses = []
            for theta in others.values():
                probe.load_state_dict(theta, strict=False)
                losses.append(evaluate(probe, x_val, y_val, device=ctx.device)[1] / n_val)
            own_loss = evaluate(model, x_val, y_val, device=ctx.device)[1] / n_val
            raw, weights = fomo_weights(own_loss, losses, [distance(theta, own) for theta in others.values()])
            if weights.sum() > 0:
                model.load_state_dict(
                    fomo_combine(own, [{k: t[k] for k in own} for t in others.values()], weights), strict=False
                )
            metrics.update({f"{FOMO_WEIGHT_METRIC}{cid}": float(w) for cid, w in zip(others, raw)})
            metrics["fomo_helpful"] = float((raw > 0).sum())
        loss = train(
            model,
            data.x_train[n_val:],
            data.y_train[n_val:],
            train_args,
            generator=ctx.generator,
            device=ctx.device,
            kept=ctx.extra_state,
        )
        return {"train_loss": loss, **metrics}
