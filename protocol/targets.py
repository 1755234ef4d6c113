"""A user's code named in a config: ``"package.module:attribute"`` (a model factory, a data function).

Both sides import it by that name, so the package must be importable on the server and on every
node (installed, or shipped in the app's FAB beside pflower). A package in the current directory is
found as ``python -m`` finds it: the directory joins ``sys.path`` and ``PYTHONPATH`` (so the
processes a run starts find it too).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any


class TargetError(ValueError):
    """A dotted path that does not name something importable; the message says what to fix."""


def import_target(target: Any, key: str) -> Callable[..., Any]:
    """The callable ``target`` names (``"package.module:factory"``); ``key`` is the config key, for the message."""
    if not isinstance(target, str) or ":" not in target or not all(target.partition(":")[::2]):
        raise TargetError(f"{key}={target!r}: name a function as 'package.module:function'")
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if not _in_working_directory(module_name, err):
            raise TargetError(
                f"{key}={target!r}: cannot import {module_name!r} ({err}); run from the directory that holds "
                f"{module_name.split('.')[0]!r}, set PYTHONPATH to that directory, or install its package "
                "(in a Flower app: ship it in the app beside pflower)"
            ) from err
        module = _import(module_name, key, target)
    except ImportError as err:
        raise TargetError(f"{key}={target!r}: cannot import {module_name!r} ({err})") from err
    obj: Any = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise TargetError(f"{key}={target!r}: module {module_name!r} has no {attribute!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TargetError(f"{key}={target!r} is a {type(obj).__name__}, not a function or class")
    return obj


def _in_working_directory(module_name: str, err: ModuleNotFoundError) -> bool:
    """Put the current directory on the import path when the missing package lies there (a console
    script, unlike ``python -m``, does not); True when it did."""
    top = module_name.split(".")[0]
    cwd = os.getcwd()
    if err.name != top or cwd in sys.path or not (os.path.isdir(top) or os.path.isfile(f"{top}.py")):
        return False
    sys.path.insert(0, cwd)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH")) if p)
    importlib.invalidate_caches()
    return True


def _import(module_name: str, key: str, target: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ImportError as err:
        raise TargetError(f"{key}={target!r}: cannot import {module_name!r} ({err})") from err


def call_with(function: Callable[..., Any], offered: Mapping[str, Any], options: Mapping[str, Any]) -> Any:
    """Call ``function`` with those of ``offered`` (in_shape, num_classes...) its signature names
    as parameters, and ``options`` (which win): ``Net()``, ``resnet(in_shape, num_classes, depth=18)``
    and ``mobilenet_v3_small(**kwargs)`` with ``options={"num_classes": 10}`` all work."""
    try:
        params = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature: options only
        params = {}
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return function(**{**{k: v for k, v in offered.items() if k in named and v is not None}, **dict(options)})
