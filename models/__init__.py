"""Model zoo. Every model is a :class:`~.layered.LayeredNet` with named layer groups; :func:`adapt`
makes one of any ``torch.nn.Module`` (``model=custom`` does it from the config)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .adapter import AdaptedNet, ModelAdaptError, adapt
from .cnn import cnn_fedtsdp, cnn_felo, cnn_kapc
from .custom import custom
from .layered import LayeredNet, buffer_keys, group_of, keys_by_group, split_groups, trainable_keys
from .lenet import lenet5
from .resnet import RESNETS
from .vgg import vgg11

ModelFactory = Callable[..., LayeredNet]

MODELS: dict[str, ModelFactory] = {
    "lenet5": lenet5,
    "cnn_fedtsdp": cnn_fedtsdp,
    "cnn_kapc": cnn_kapc,
    "cnn_felo": cnn_felo,
    "vgg11": vgg11,
    **RESNETS,
    "custom": custom,  # a user's factory: model.target=package.module:function
}


def model_options(name: str) -> list[str]:
    """The keyword options a registered model takes (besides the input shape and classes)."""
    import inspect

    params = list(inspect.signature(MODELS[name]).parameters.values())[2:]
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def build_model(
    name: str,
    in_shape: tuple[int, int, int],
    num_classes: int,
    seed: int | None = None,
    **kwargs: Any,
) -> LayeredNet:
    """Build a registered model; with ``seed`` the initial weights are reproducible.

    Server and clients build the same initial model from the same seed, so a group that
    is never sent (a FedPer head, a purely local model) starts from the same weights
    everywhere.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid models: {sorted(MODELS)}")
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return MODELS[name](tuple(in_shape), num_classes, **kwargs)
    return MODELS[name](tuple(in_shape), num_classes, **kwargs)


__all__ = [
    "MODELS",
    "AdaptedNet",
    "ModelAdaptError",
    "adapt",
    "LayeredNet",
    "build_model",
    "buffer_keys",
    "group_of",
    "keys_by_group",
    "split_groups",
    "trainable_keys",
]
