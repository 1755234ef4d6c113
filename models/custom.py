"""``model=custom``: a user's model from the config, by the dotted path of its factory.

    pflower sim model=custom model.target=mypkg.nets:Net
    pflower sim model=custom model.target=torchvision.models:mobilenet_v3_small model.options.num_classes=10

The factory gets ``in_shape`` and ``num_classes`` where its signature names them, and
``model.options`` as keyword arguments; what it returns is adapted (:func:`~.adapter.adapt`,
``model.groups`` names the layer groups where the top-level children are not the right ones).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pflower.protocol.targets import call_with, import_target

from .adapter import adapt
from .layered import LayeredNet


def custom(
    in_shape: tuple[int, int, int],
    num_classes: int,
    target: str = "",
    groups: Mapping[str, Sequence[str] | str] | None = None,
    options: Mapping[str, Any] | None = None,
) -> LayeredNet:
    """The module ``target`` builds, as a pflower model (checked on one input of ``in_shape``)."""
    factory = import_target(target, "model.target")
    module = call_with(factory, {"in_shape": tuple(in_shape), "num_classes": num_classes}, options or {})
    return adapt(module, dict(groups) if groups else None, in_shape)
