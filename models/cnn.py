"""Plain CNNs of the FedTSDP (FedTSDP paper, models) and KAPC/BLS (KAPC paper, models and data) papers.

Group convention shared by every model in this zoo: a group's output is a clean
activation (after ReLU/pool, flattened before the first FC layer) and Dropout opens the
group that consumes it. Group outputs are the "taps" layer-wise methods read
(FedCPMD paper, model partition and candidate layers: post-ReLU, pre-Dropout). The forward pass is the same as the
papers'
flat layer lists, and each parameter belongs to the same group either way.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import torch
from torch import nn

from .layered import LayeredNet


def conv_relu(
    c_in: int, c_out: int, kernel_size: int, padding: int = 0, tail: Iterable[nn.Module] = ()
) -> nn.Sequential:
    """Conv -> ReLU, then ``tail`` (pooling, flatten) so a pool lives in its conv's group."""
    conv = nn.Conv2d(c_in, c_out, kernel_size, padding=padding)
    return nn.Sequential(conv, nn.ReLU(inplace=True), *tail)


def dense(d_in: int, d_out: int, dropout: float = 0.0, relu: bool = True) -> nn.Sequential:
    """[Dropout ->] Linear [-> ReLU]; dropping the input keeps the previous group's output clean."""
    layers: list[nn.Module] = [nn.Dropout(dropout)] if dropout > 0 else []
    layers.append(nn.Linear(d_in, d_out))
    if relu:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


def pool_flatten(pool: bool = True) -> list[nn.Module]:
    """Tail of the last conv group: [2x2 max-pool,] flatten (one FC input vector per sample)."""
    return [nn.MaxPool2d(2), nn.Flatten()] if pool else [nn.Flatten()]


def flat_dim(body: Iterable[nn.Module], in_shape: tuple[int, int, int], model: str) -> int:
    """Width of the flattened conv output, from one dummy sample (no per-model size arithmetic)."""
    x = torch.zeros(1, *in_shape)
    try:
        with torch.no_grad():
            for module in body:
                x = module(x)
    except RuntimeError as err:
        raise ValueError(f"{model}: input shape {tuple(in_shape)} is too small") from err
    return x.shape[1]


def with_fc_head(
    model: str,
    in_shape: tuple[int, int, int],
    convs: "OrderedDict[str, nn.Module]",
    hidden: Iterable[int],
    num_classes: int,
    dropouts: Iterable[float] | None = None,
) -> LayeredNet:
    """Append ``fc1..fcK`` (Linear-ReLU of widths ``hidden``) and the ``classifier`` to conv groups.

    ``dropouts`` gives the input dropout of each FC group (len(hidden)+1 values; none if None).
    """
    widths = list(hidden)
    drops = list(dropouts) if dropouts is not None else [0.0] * (len(widths) + 1)
    if len(drops) != len(widths) + 1:
        raise ValueError(f"{model}: need {len(widths) + 1} dropout rates, got {len(drops)}")
    groups = OrderedDict(convs)
    width = flat_dim(groups.values(), in_shape, model)
    for i, (out, p) in enumerate(zip(widths, drops), start=1):
        groups[f"fc{i}"] = dense(width, out, dropout=p)
        width = out
    groups["classifier"] = dense(width, num_classes, dropout=drops[-1], relu=False)
    return LayeredNet(groups)


def cnn_fedtsdp(in_shape: tuple[int, int, int], num_classes: int, pool_after_each_conv: bool = False) -> LayeredNet:
    """FedTSDP's CNN (Keras "mnist_cnn"): 6,447,562 parameters on 3x32x32 with C=10.

    conv1 = Conv(C,32,3)-ReLU; conv2 = Conv(32,64,3)-ReLU-MaxPool(2)-Flatten;
    fc1 = Dropout(0.25)-Linear(.,512)-ReLU; classifier = Dropout(0.5)-Linear(512,C).
    ``pool_after_each_conv`` (the FedTSDP paper's CNN as its code builds it) adds a 2x2 max-pool to conv1 as well.
    """
    c = in_shape[0]
    convs = OrderedDict(
        conv1=conv_relu(c, 32, 3, tail=[nn.MaxPool2d(2)] if pool_after_each_conv else []),
        conv2=conv_relu(32, 64, 3, tail=pool_flatten()),
    )
    return with_fc_head("cnn_fedtsdp", in_shape, convs, [512], num_classes, dropouts=[0.25, 0.5])


def cnn_kapc(in_shape: tuple[int, int, int], num_classes: int) -> LayeredNet:
    """KAPC/BLS's MNIST CNN: two 5x5 conv-ReLU-pool blocks, FC 512 and 128.

    643,850 parameters on 1x28x28 with C=10 (flattened conv output 64*4*4 = 1024).
    """
    c = in_shape[0]
    convs = OrderedDict(
        conv1=conv_relu(c, 32, 5, tail=[nn.MaxPool2d(2)]),
        conv2=conv_relu(32, 64, 5, tail=pool_flatten()),
    )
    return with_fc_head("cnn_kapc", in_shape, convs, [512, 128], num_classes)


def cnn_felo(
    in_shape: tuple[int, int, int],
    num_classes: int,
    channels: tuple[int, ...] = (64, 128, 256),
    dropout: float = 0.2,
    feature_dim: int = 1024,
) -> LayeredNet:
    """The Felo/Velo authors' light CNNs (their code's ``--old_CNN``, ``modules/old_Model.py``).

    conv1 = Conv(C,n1,3,same)-BN-ReLU-Dropout-AvgPool(2,stride 1,pad 1); conv2 = Conv(n1,n2,3,stride 2)
    -BN-ReLU-Dropout-AvgPool(2); conv3 (three channel widths only) = Conv(n2,n3,3,stride 2)-BN-ReLU
    -Dropout; feature = Flatten-Linear(., feature_dim), no activation (the features Felo shares);
    classifier = Linear(feature_dim, C) without bias. The authors' clients 0-4 use channels (64, 256),
    5-9 (64, 128, 256). 2,741,120 parameters with three widths on 1x32x32 with C=10.
    """
    if len(channels) not in (2, 3):
        raise ValueError(f"cnn_felo: channels must have 2 or 3 widths (conv layers), got {list(channels)}")

    def block(c_in: int, c_out: int, **conv: int | str) -> list[nn.Module]:
        return [nn.Conv2d(c_in, c_out, 3, **conv), nn.BatchNorm2d(c_out), nn.ReLU(), nn.Dropout(dropout)]

    n = list(channels)
    convs = OrderedDict(
        conv1=nn.Sequential(*block(in_shape[0], n[0], padding="same"), nn.AvgPool2d(2, stride=1, padding=1)),
        conv2=nn.Sequential(*block(n[0], n[1], stride=2), nn.AvgPool2d(2, stride=2)),
    )
    if len(n) == 3:
        convs["conv3"] = nn.Sequential(*block(n[1], n[2], stride=2))
    width = flat_dim([*convs.values(), nn.Flatten()], in_shape, "cnn_felo")
    groups = OrderedDict(convs)
    groups["feature"] = nn.Sequential(nn.Flatten(), nn.Linear(width, feature_dim))
    groups["classifier"] = nn.Linear(feature_dim, num_classes, bias=False)
    return LayeredNet(groups)
