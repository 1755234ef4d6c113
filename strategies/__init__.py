"""Server-side strategies: one file per method on the shared :class:`PersonalizedStrategy` base.

A method registers itself by subclassing the base with its own ``name`` (no list to edit):
importing this package imports every module in it.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from .base import METHODS, PersonalizedStrategy
from .options import MethodOptions, OptionError

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

STRATEGIES: dict[str, type[PersonalizedStrategy]] = dict(sorted(METHODS.items()))


def method_options(name: str) -> list[str]:
    """The method-specific options a strategy accepts (its conf/method/ keys)."""
    return STRATEGIES[name].options_type.names()


def options_of(name: str) -> type[MethodOptions]:
    """The options dataclass of method ``name``."""
    return STRATEGIES[name].options_type


def build_strategy(
    name: str, *args: Any, method_args: dict[str, Any] | None = None, **kwargs: Any
) -> PersonalizedStrategy:
    """Instantiate a registered method; unknown names or options get a message listing the valid ones."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown method {name!r}; valid methods: {sorted(STRATEGIES)}")
    return STRATEGIES[name](*args, **kwargs, **dict(method_args or {}))


__all__ = [
    "STRATEGIES",
    "MethodOptions",
    "OptionError",
    "PersonalizedStrategy",
    "build_strategy",
    "method_options",
    "options_of",
]
