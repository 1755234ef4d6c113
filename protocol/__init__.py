"""What the ServerApp and the ClientApps share: message keys, the task spec, role arguments.

Both sides import this package and nothing of each other: strategies never import client code,
and the client runtime never imports strategies.
"""

from .roles import ROLE_ARGS, RoleArgs, RoleArgsError, role_args
from .wire import (
    STATE_EXTRA_PREFIX,
    WIRE_EXTRA_PREFIX,
    SpecError,
    TaskSpec,
)

__all__ = [
    "ROLE_ARGS",
    "STATE_EXTRA_PREFIX",
    "WIRE_EXTRA_PREFIX",
    "RoleArgs",
    "RoleArgsError",
    "SpecError",
    "TaskSpec",
    "role_args",
]
