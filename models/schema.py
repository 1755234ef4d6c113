"""What the server knows of a model without holding the module: its schema, and who runs which.

A :class:`ModelSchema` is one architecture's layer groups, the keys of each group and the shape
and dtype of every tensor, with the architecture's spec (what a client builds from). The strategy
base keeps one per architecture and looks a client's up by its client id, so a federation of
different models (Felo/Velo's ResNet10..50) is the general case and a homogeneous run is the
one-architecture case. :func:`assign_archs` turns the config's rule into client -> architecture.

Also here: key helpers both sides use (BatchNorm parameters and buffers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import nn

from .adapter import own_names
from .layered import LayeredNet, group_of

Template = dict[str, tuple[tuple[int, ...], np.dtype]]

ASSIGN_RULES = ("blocks", "round_robin")


def batchnorm_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """Every BatchNorm module, in forward (registration) order."""
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def batchnorm_keys(model: nn.Module) -> list[str]:
    """State-dict keys of the trainable parameters (gamma, beta) of every BatchNorm layer, in forward order."""
    return [
        f"{name}.{pname}"
        for name, module in model.named_modules()
        if isinstance(module, nn.modules.batchnorm._BatchNorm)
        for pname, p in module.named_parameters(recurse=False)
        if p.requires_grad
    ]


WEIGHT_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def parameter_layers(model: nn.Module) -> list[list[str]]:
    """The model's weight layers (KAPC's "layers", KAPC paper, notation): each Conv/Linear in
    registration (forward) order with its bias and the affine parameters of the BatchNorm that
    follows it. ResNet18 has 21, the KAPC CNN 5, LeNet-5 (3 FC) 5. Any other parameter joins the
    layer before it, so the layers cover every trainable key exactly once."""
    layers: list[list[str]] = []
    for name, module in model.named_modules():
        own = [f"{name}.{p}" if name else p for p, _ in module.named_parameters(recurse=False)]
        if not own:
            continue
        if isinstance(module, WEIGHT_LAYERS) or not layers:
            layers.append(own)
        else:
            layers[-1].extend(own)
    return layers


def layer_dims(model: nn.Module, layers: list[list[str]]) -> list[tuple[int, int]]:
    """(d, n) of each layer's weight as a matrix: d = out features/channels, n = in x kernel
    (KAPC paper, notation, the dimensions BLS's generalization bound uses)."""
    params = dict(model.named_parameters())
    out = []
    for keys in layers:
        weight = params[keys[0]]
        out.append((int(weight.shape[0]), int(weight[0].numel()) if weight.dim() > 1 else 1))
    return out


def float_buffer_keys(model: nn.Module) -> list[str]:
    """State-dict keys of floating-point buffers (BN running mean/var), not counters such as
    ``num_batches_tracked``: the buffers that can be averaged (``shared_buffers``)."""
    return [name for name, b in model.named_buffers() if b.is_floating_point()]


@dataclass(frozen=True)
class ModelSchema:
    """One architecture as the server sees it.

    ``spec``: the model spec a client builds (``{"name": "resnet18", "stem": ...}``).
    ``group_keys``: trainable keys per group; ``group_buffers``: float buffer keys per group;
    ``template``: shape and dtype of every trainable tensor and float buffer; ``state_order``:
    all of them in state-dict (registration) order; ``bn_params`` / ``bn_channels``: the BatchNorm
    layers' affine keys and widths (FedBN, FedAP).
    """

    arch: str
    spec: dict[str, Any]
    groups: tuple[str, ...]
    group_keys: dict[str, tuple[str, ...]]
    group_buffers: dict[str, tuple[str, ...]]
    template: Template
    state_order: tuple[str, ...] = field(default=())
    bn_params: tuple[str, ...] = field(default=())  # BatchNorm gamma/beta keys, forward order
    bn_channels: tuple[int, ...] = field(default=())  # features of every BatchNorm layer, forward order
    layers: tuple[tuple[str, ...], ...] = field(default=())  # weight layers (parameter_layers), forward order
    layer_dims: tuple[tuple[int, int], ...] = field(default=())  # (d, n) of each layer's weight matrix
    # every state-dict key -> its name in the user's own module (models.adapter.own_names): what
    # Flower's initial_arrays, Result.arrays and evaluate_fn carry
    own_names: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, model: LayeredNet, arch: str, spec: Mapping[str, Any]) -> ModelSchema:
        state = model.state_dict()
        params = {name for name, _ in model.named_parameters()}
        buffers = set(float_buffer_keys(model))
        groups = tuple(model.group_names)
        group_keys = {g: tuple(k for k in state if k in params and group_of(k) == g) for g in groups}
        group_buffers = {g: tuple(k for k in state if k in buffers and group_of(k) == g) for g in groups}
        template = {
            k: (tuple(v.shape), v.detach().cpu().numpy().dtype) for k, v in state.items() if k in params | buffers
        }
        order = tuple(k for k in state if k in params | buffers)
        bn = (tuple(batchnorm_keys(model)), tuple(m.num_features for m in batchnorm_layers(model)))
        layers = parameter_layers(model)
        weight_layers = (tuple(tuple(keys) for keys in layers), tuple(layer_dims(model, layers)))
        return cls(
            arch, dict(spec), groups, group_keys, group_buffers, template, order, *bn, *weight_layers, own_names(model)
        )

    def keys(self, groups: Iterable[str] | None = None, buffers: bool = False) -> list[str]:
        """Trainable keys of ``groups`` (all if None), and their float buffers too when ``buffers``,
        in state-dict order."""
        wanted = set(self.groups if groups is None else groups)
        unknown = wanted - set(self.groups)
        if unknown:
            raise KeyError(f"unknown layer group(s) {sorted(unknown)}; {self.arch} groups: {list(self.groups)}")
        keys = {k for g in wanted for k in self.group_keys[g]}
        if buffers:
            keys |= {k for g in wanted for k in self.group_buffers[g]}
        return [k for k in self.state_order if k in keys]

    def trainable(self) -> list[str]:
        return self.keys()


def initial_arrays(model: LayeredNet, keys: Sequence[str]) -> dict[str, np.ndarray]:
    """Copies of ``keys`` of the model's state (the server's initial global values)."""
    state = model.state_dict()
    return {k: state[k].detach().cpu().numpy().copy() for k in keys}


def assign_archs(rule: str | Mapping[Any, str], archs: Sequence[str], num_clients: int) -> dict[int, str]:
    """Client id -> architecture from the config's rule.

    ``blocks``: contiguous blocks, client i gets ``archs[i * len(archs) // num_clients]``
    (Felo/Velo paper, what travels each round: clients 0..K/5-1 the first model, ...); ``round_robin``: ``archs[i %
    len(archs)]``; a mapping names each client's architecture (every client must be named).
    """
    archs = list(archs)
    if not archs:
        raise ValueError("a federation needs at least one architecture")
    if isinstance(rule, Mapping):
        out = {}
        for key, arch in rule.items():
            cid = int(key)
            if arch not in archs:
                raise ValueError(f"model.assign gives client {cid} architecture {arch!r}; model.archs has {archs}")
            out[cid] = str(arch)
        missing = sorted(set(range(num_clients)) - set(out))
        if missing:
            raise ValueError(
                f"model.assign names no architecture for client(s) {missing[:10]}: name every client "
                f"0..{num_clients - 1}, or use blocks / round_robin"
            )
        extra = sorted(c for c in out if not 0 <= c < num_clients)
        if extra:
            raise ValueError(f"model.assign names client(s) {extra[:10]} outside 0..{num_clients - 1}")
        return out
    if rule == "blocks":
        return {i: archs[i * len(archs) // num_clients] for i in range(num_clients)}
    if rule == "round_robin":
        return {i: archs[i % len(archs)] for i in range(num_clients)}
    raise ValueError(
        f"model.assign must be one of {list(ASSIGN_RULES)} or a mapping client id -> architecture, got {rule!r}"
    )
