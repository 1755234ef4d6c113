"""torchvision ResNets of depth 10..50 as LayeredNets (Felo/Velo paper, models and data, FedTSDP paper, models).

One builder, :func:`resnet`, takes the block type and per-stage block counts from
``RESNET_LAYOUTS``; the registry names ``resnet10``..``resnet50`` only fix the depth. The
depth is 2*sum(blocks)+2 for BasicBlock and 3*sum(blocks)+2 for Bottleneck (Felo/Velo paper, models and data).

Groups: stem (conv1, bn1, relu[, maxpool]), layer1..layer4, pool (avgpool, flatten[,
projection]), classifier. ``features()`` is therefore the felo/velo extractor E (the
flattened D-dim feature) and the classifier is H.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import nn

from .layered import LayeredNet

if TYPE_CHECKING:  # torchvision is imported only when a ResNet is built: its import is seconds of every process's start
    from torchvision.models.resnet import ResNet

# block type ("basic" = BasicBlock, "bottleneck" = Bottleneck) and blocks per stage
RESNET_LAYOUTS: dict[int, tuple[str, tuple[int, int, int, int]]] = {
    10: ("basic", (1, 1, 1, 1)),
    14: ("basic", (1, 1, 2, 2)),
    18: ("basic", (2, 2, 2, 2)),
    22: ("basic", (2, 2, 3, 3)),
    26: ("basic", (3, 3, 3, 3)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
}

STEMS = ("imagenet", "cifar")


def _stem(net: "ResNet", in_channels: int, stem: str) -> nn.Sequential:
    """torchvision stem (7x7/2 conv + 3x3/2 max-pool) or the CIFAR one (3x3/1 conv, no max-pool).

    The first conv is rebuilt (with torchvision's Kaiming init) only when the input channels
    or the stem differ from torchvision's, so the default 3-channel model is torchvision's own.
    """
    if stem not in STEMS:
        raise ValueError(f"unknown ResNet stem {stem!r}; valid stems: {list(STEMS)}")
    kernel, stride, padding = (7, 2, 3) if stem == "imagenet" else (3, 1, 1)
    conv = net.conv1
    if (in_channels, kernel) != (conv.in_channels, conv.kernel_size[0]):
        conv = nn.Conv2d(in_channels, conv.out_channels, kernel, stride=stride, padding=padding, bias=False)
        nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    layers = OrderedDict(conv1=conv, bn1=net.bn1, relu=net.relu)
    if stem == "imagenet":
        layers["maxpool"] = net.maxpool
    return nn.Sequential(layers)


def _pool(width: int, feature_dim: int) -> nn.Sequential:
    """Global average pool + flatten; a Linear-ReLU projection when the shared feature width
    differs from the native one (Felo/Velo paper, points it leaves open: ResNet50's 2048 -> 512)."""
    layers: OrderedDict[str, nn.Module] = OrderedDict(avgpool=nn.AdaptiveAvgPool2d(1), flatten=nn.Flatten())
    if feature_dim != width:
        layers["proj"] = nn.Linear(width, feature_dim)
        layers["proj_relu"] = nn.ReLU(inplace=True)
    return nn.Sequential(layers)


def resnet(
    depth: int,
    in_shape: tuple[int, int, int],
    num_classes: int,
    stem: str = "imagenet",
    feature_dim: int | None = None,
    blocks: Sequence[int] | None = None,
) -> LayeredNet:
    """ResNet-``depth`` built from torchvision's ResNet class.

    ``stem``: "imagenet" (Felo/Velo paper, models and data, default) or "cifar" (FedTSDP paper, models).
    ``feature_dim``: width of the ``pool`` output (None = native: 512, or 2048 for ResNet50).
    ``blocks``: override the per-stage block counts (the FedTSDP paper's ``resnet_blocks``).
    """
    if depth not in RESNET_LAYOUTS:
        raise ValueError(f"unknown ResNet depth {depth}; valid depths: {sorted(RESNET_LAYOUTS)}")
    block, default_blocks = RESNET_LAYOUTS[depth]
    layout = list(blocks if blocks is not None else default_blocks)
    if len(layout) != 4 or min(layout) < 1:
        raise ValueError(f"ResNet blocks must be 4 positive counts, got {layout}")
    from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

    net = ResNet({"basic": BasicBlock, "bottleneck": Bottleneck}[block], layout, num_classes=num_classes)
    width = net.fc.in_features
    dim = width if feature_dim is None else feature_dim
    groups: OrderedDict[str, nn.Module] = OrderedDict(stem=_stem(net, in_shape[0], stem))
    for name in ("layer1", "layer2", "layer3", "layer4"):
        groups[name] = getattr(net, name)
    groups["pool"] = _pool(width, dim)
    groups["classifier"] = net.fc if dim == width else nn.Linear(dim, num_classes)
    return LayeredNet(groups)


def _factory(depth: int):
    """Registry entry ``resnet<depth>(in_shape, num_classes, **kwargs)``."""

    def build(in_shape: tuple[int, int, int], num_classes: int, **kwargs: Any) -> LayeredNet:
        return resnet(depth, in_shape, num_classes, **kwargs)

    params = list(inspect.signature(resnet).parameters.values())[1:]  # the options, without the depth
    build.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    build.__name__ = build.__qualname__ = f"resnet{depth}"
    build.__doc__ = f"ResNet{depth}; keyword arguments as in :func:`resnet`."
    return build


RESNETS = {f"resnet{depth}": _factory(depth) for depth in RESNET_LAYOUTS}
