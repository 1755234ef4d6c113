"""Client roles: what a method does on the client, chosen by the ``role`` in the message config."""

from __future__ import annotations

from typing import Any

from .base import Role, RoleContext, SGDRole
from .fedcmd import FedCMDRole

ROLES: dict[str, type[Role]] = {cls.name: cls for cls in (SGDRole, FedCMDRole)}


def build_role(name: str, args: dict[str, Any]) -> Role:
    if name not in ROLES:
        raise ValueError(f"unknown client role {name!r}; this ClientApp knows {sorted(ROLES)} (update pflower on the node)")
    return ROLES[name](args)


__all__ = ["ROLES", "FedCMDRole", "Role", "RoleContext", "SGDRole", "build_role"]
