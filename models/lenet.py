"""LeNet-5 with BatchNorm and its 1-4 FC-layer variants (FedCMD paper, LeNet-5 (Table XI), FedCPMD paper, models and
data)."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from .layered import LayeredNet

_HIDDEN = (120, 84, 64)  # fc1, fc2, fc3 widths (the FedCMD paper's LeNet-5 tables)


def _conv_block(c_in: int, c_out: int, flatten: bool) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(c_in, c_out, kernel_size=5),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2, 2),
    ]
    if flatten:
        layers.append(nn.Flatten())
    return nn.Sequential(*layers)


def lenet5(
    in_shape: tuple[int, int, int], num_classes: int, fc_layers: int = 3, feature_dim: int | None = None
) -> LayeredNet:
    """LeNet-5: conv1, conv2, then ``fc_layers`` linear groups, the last named ``classifier``.

    ``fc_layers=3`` is the papers' main model (fc1 120, fc2 84, classifier); 2 is FedCMD's
    "Extended 1", 4 is "Extended 2" (adds fc3 of 64 units), 1 goes straight to the classifier.
    ``feature_dim``: the width of the last hidden layer (the classifier's input) instead of its
    default, so that variants of different depth share one feature width (Felo/Velo).
    """
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
    flat = 16 * side_h * side_w
    groups: OrderedDict[str, nn.Module] = OrderedDict(
        conv1=_conv_block(c, 6, flatten=False), conv2=_conv_block(6, 16, flatten=True)
    )
    width = flat
    hidden_widths = list(_HIDDEN[: fc_layers - 1])
    if feature_dim is not None:
        hidden_widths[-1] = int(feature_dim)
    for i, hidden in enumerate(hidden_widths, start=1):
        groups[f"fc{i}"] = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(inplace=True))
        width = hidden
    groups["classifier"] = nn.Linear(width, num_classes)
    return LayeredNet(groups)
