"""Client roles: what a method does on the client, chosen by the ``role`` in the message config."""

from __future__ import annotations

from typing import Any

from .base import Role, RoleContext, SGDRole
from .ditto import DittoRole
from .fedamp import FedAMPRole
from .fedap import FedAPRole
from .fedbabu import FedBabuRole
from .fedcmd import FedCMDRole
from .fedcpmd import FedCPMDRole
from .feddyn import FedDynRole
from .fedfomo import FedFomoRole
from .fedrep import FedRepRole
from .felo import FeloRole
from .kapc import KAPCRole
from .moon import MOONRole
from .proximal import ProximalRole

ROLES: dict[str, type[Role]] = {cls.name: cls for cls in (SGDRole, FedCMDRole, ProximalRole, FedRepRole, FedBabuRole, DittoRole)}
ROLES.update({cls.name: cls for cls in (FedAMPRole, FedDynRole, FedFomoRole, FedAPRole, MOONRole, FedCPMDRole, KAPCRole, FeloRole)})


def build_role(name: str, args: dict[str, Any]) -> Role:
    if name not in ROLES:
        raise ValueError(f"unknown client role {name!r}; this ClientApp knows {sorted(ROLES)} (update pflower on the node)")
    return ROLES[name](args)


__all__ = ["ROLES", "DittoRole", "FedBabuRole", "FedCMDRole", "FedRepRole", "ProximalRole", "Role", "RoleContext", "SGDRole", "build_role"]
__all__ += ["FedAMPRole", "FedAPRole", "FedCPMDRole", "FedDynRole", "FedFomoRole", "KAPCRole", "MOONRole"]
