"""Client roles: what a method does on the client, chosen by the ``role`` in the message config.

A role registers itself by subclassing :class:`Role` with its own ``name`` in this package;
importing the package imports every module in it.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from .base import ROLES, Role, RoleContext, SGDRole

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def build_role(name: str, args: dict[str, Any]) -> Role:
    if name not in ROLES:
        raise ValueError(
            f"unknown client role {name!r}; this ClientApp knows {sorted(ROLES)} (update pflower on the node)"
        )
    return ROLES[name](args)


__all__ = ["ROLES", "Role", "RoleContext", "SGDRole", "build_role"]
