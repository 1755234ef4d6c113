"""LeNet-5 with BatchNorm and its 1-4 FC-layer variants (FedCMD paper, LeNet-5 (Table XI), FedCPMD paper, models and
data)."""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

from .layered import LayeredNet

_HIDDEN = (120, 84, 64)  # fc1, fc2, fc3 widths (the FedCMD paper's LeNet-5 tables)


class Scaler(nn.Module):
    """HeteroFL's scaler: divides a layer's output by the width rate r while training, so a
    sub-model of r times the channels feeds the next layer sums of the full model's size; the
    identity in evaluation (HeteroFL paper, "Scaler"). No parameters: the state-dict keys stay
    those of the model without it only where no index shifts, so a model uses it everywhere or
    nowhere."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = float(rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.rate if self.training else x

    def extra_repr(self) -> str:
        return f"rate={self.rate}"


def scaled(units: int, width: float) -> int:
    """A layer's units at width rate ``width``: ceil(width * units), at least 1 (HeteroFL's rule)."""
    return max(1, math.ceil(width * units))


def _conv_block(c_in: int, c_out: int, flatten: bool, scaler: float | None = None) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, kernel_size=5)]
    if scaler is not None:
        layers.append(Scaler(scaler))
    layers += [nn.BatchNorm2d(c_out), nn.ReLU(inplace=True), nn.MaxPool2d(2, 2)]
    if flatten:
        layers.append(nn.Flatten())
    return nn.Sequential(*layers)


def lenet5(
    in_shape: tuple[int, int, int],
    num_classes: int,
    fc_layers: int = 3,
    feature_dim: int | None = None,
    width: float = 1.0,
    scaler: bool = False,
) -> LayeredNet:
    """LeNet-5: conv1, conv2, then ``fc_layers`` linear groups, the last named ``classifier``.

    ``fc_layers=3`` is the papers' main model (fc1 120, fc2 84, classifier); 2 is FedCMD's
    "Extended 1", 4 is "Extended 2" (adds fc3 of 64 units), 1 goes straight to the classifier.
    ``feature_dim``: the width of the last hidden layer (the classifier's input) instead of its
    default, so that variants of different depth share one feature width (Felo/Velo).
    ``width`` r in (0, 1]: every hidden layer keeps ceil(r x) of its x units (channels of the
    convolutions, units of the hidden linear layers; input and classes unchanged), HeteroFL's
    sub-model of the full LeNet-5: each of its tensors is the leading block of the full model's.
    ``scaler``: a :class:`Scaler` of rate r after every hidden layer (HeteroFL's models use it at
    every width, 1 included; without it the model is exactly the plain LeNet-5).
    """
    if not 0.0 < float(width) <= 1.0:
        raise ValueError(f"lenet5 width must be in (0, 1] (a share of the full model's units), got {width}")
    if not 1 <= fc_layers <= 4:
        raise ValueError(f"lenet5 fc_layers must be 1..4, got {fc_layers}")
    if feature_dim is not None and (fc_layers == 1 or int(feature_dim) < 1):
        raise ValueError(
            f"lenet5 feature_dim needs fc_layers >= 2 (a hidden layer to set) and a positive width, got {feature_dim}"
        )
    c, h, w = in_shape
    side_h, side_w = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2  # after conv1, pool, conv2, pool
    if side_h < 1 or side_w < 1:  # each side on its own: two negative sides multiply to a positive size
        raise ValueError(f"lenet5 needs inputs of at least 16x16 pixels, got {h}x{w}")
    rate = float(width)
    scale = rate if scaler else None
    c1, c2 = scaled(6, rate), scaled(16, rate)
    groups: OrderedDict[str, nn.Module] = OrderedDict(
        conv1=_conv_block(c, c1, flatten=False, scaler=scale), conv2=_conv_block(c1, c2, flatten=True, scaler=scale)
    )
    units = c2 * side_h * side_w  # channel-major flatten: a sub-model's inputs are the full model's first ones
    hidden_widths = list(_HIDDEN[: fc_layers - 1])
    if feature_dim is not None:
        hidden_widths[-1] = int(feature_dim)
    for i, hidden in enumerate(hidden_widths, start=1):
        out = scaled(hidden, rate)
        layers: list[nn.Module] = [nn.Linear(units, out)]
        if scale is not None:
            layers.append(Scaler(scale))
        groups[f"fc{i}"] = nn.Sequential(*layers, nn.ReLU(inplace=True))
        units = out
    groups["classifier"] = nn.Linear(units, num_classes)
    return LayeredNet(groups)
