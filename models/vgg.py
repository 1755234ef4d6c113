"""VGG11 without BatchNorm, torchvision layout (FedCPMD paper, models and data, Table 18).

Groups conv1..conv8 (each Conv3x3-ReLU plus the max-pool that follows it; conv8 also
holds the adaptive average pool and the flatten, so its output is the FC input o_0),
then fc1, fc2, classifier. As in the rest of the zoo Dropout opens fc2 and the
classifier, so fc1/fc2 outputs are the post-ReLU, pre-Dropout taps of FedCPMD paper, model partition and candidate
layers.
Pools use ``ceil_mode=True``: the five pools then take 28x28 down to 1x1 (28-14-7-4-2-1)
and give the same maps as torchvision on 32x32 and 64x64 inputs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

from torch import nn

from .cnn import conv_relu, with_fc_head
from .layered import LayeredNet

VGG11_LAYOUT: tuple[int | str, ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


def _convs_with_pool(layout: Sequence[int | str]) -> Iterator[tuple[int, bool]]:
    """(out_channels, followed_by_pool) for every conv of a VGG layout string."""
    for i, item in enumerate(layout):
        if item != "M":
            yield int(item), i + 1 < len(layout) and layout[i + 1] == "M"


def _init_like_torchvision(model: nn.Module) -> None:
    """torchvision VGG init (Kaiming fan-out convs, N(0, 0.01) linears, zero biases), so
    training matches the reference and ImageNet weights could be loaded shape for shape."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)


def vgg11(
    in_shape: tuple[int, int, int],
    num_classes: int,
    pool_size: int = 7,
    fc_dim: int = 4096,
    dropout: float = 0.5,
) -> LayeredNet:
    """VGG11: 128,807,306 parameters for C=10 with the defaults (fc1 is 25088 -> 4096)."""
    convs: OrderedDict[str, nn.Module] = OrderedDict()
    c_in = in_shape[0]
    layers = list(_convs_with_pool(VGG11_LAYOUT))
    for i, (c_out, pooled) in enumerate(layers, start=1):
        tail: list[nn.Module] = [nn.MaxPool2d(2, ceil_mode=True)] if pooled else []
        if i == len(layers):
            tail += [nn.AdaptiveAvgPool2d(pool_size), nn.Flatten()]
        convs[f"conv{i}"] = conv_relu(c_in, c_out, 3, padding=1, tail=tail)
        c_in = c_out
    drops = [0.0, dropout, dropout]  # on the inputs of fc1, fc2, classifier
    model = with_fc_head("vgg11", in_shape, convs, [fc_dim, fc_dim], num_classes, dropouts=drops)
    _init_like_torchvision(model)
    return model
