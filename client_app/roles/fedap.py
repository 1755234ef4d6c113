"""FedAP's client side (Lu et al., 2022): plain SGD, plus the BN statistics of the received model.

When the server asks (``bn_stats``: the client's first round after the warm-up, so every
client measures the same warm-up model), the client runs its training split through the
received model in eval mode before training and uploads, for every BatchNorm layer i in
forward order, the per-channel mean and variance of that layer's *input* over all samples
(and positions) as extra arrays ``bn_mean/<i>`` and ``bn_var/<i>``. ``epochs`` overrides the
local epochs (FedAP's warm-up uses 1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.models.schema import batchnorm_layers
from pflower.protocol.options import sent

from ..training import TrainArgs
from .base import RoleContext, SGDArgs, SGDRole


@torch.no_grad()
def bn_input_stats(
    model: nn.Module, x: torch.Tensor, device: torch.device, batch_size: int = 256
) -> dict[str, torch.Tensor]:
    """{"bn_mean/<i>", "bn_var/<i>"}: channel mean and (population) variance of each BN layer's input."""
    layers = batchnorm_layers(model)
    sums = [torch.zeros(m.num_features, dtype=torch.float64) for m in layers]
    squares = [torch.zeros(m.num_features, dtype=torch.float64) for m in layers]
    counts = [0] * len(layers)

    def hook(i: int):
        def record(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            h = inputs[0].detach().double().transpose(0, 1).reshape(inputs[0].shape[1], -1).cpu()  # [C, N * positions]
            sums[i] += h.sum(dim=1)
            squares[i] += (h**2).sum(dim=1)
            counts[i] += h.shape[1]

        return record

    handles = [m.register_forward_pre_hook(hook(i)) for i, m in enumerate(layers)]
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(x), batch_size):
            model(x[start : start + batch_size].to(device))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    out: dict[str, torch.Tensor] = {}
    for i, (s, q, n) in enumerate(zip(sums, squares, counts)):
        mean = s / max(n, 1)
        out[f"bn_mean/{i}"] = mean.float()
        out[f"bn_var/{i}"] = (q / max(n, 1) - mean**2).clamp_min(0.0).float()
    return out


@dataclass(frozen=True)
class FedAPArgs(SGDArgs):
    """FedAP's client: the BN input statistics when asked, and the round's epochs."""

    bn_stats: bool = sent(False, "upload the BN input statistics of the received model this round")
    epochs: int | None = sent(None, "this round's local epochs (null: the run's; the warm-up's 1)", low=0)


class FedAPRole(SGDRole):
    name = "fedap"
    args_type = FedAPArgs

    def fit(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict[str, float]:
        if self.args.bn_stats:
            ctx.upload_extra.update(bn_input_stats(model, data.x_train, ctx.device))
        if self.args.epochs is not None:
            train_args = replace(train_args, epochs=int(self.args.epochs), steps=None)
        return super().fit(model, data, train_args, ctx)
