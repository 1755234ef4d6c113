"""What the ServerApp and the ClientApps share: message keys, the task spec, the options machinery
and the generic base of a role's arguments.

The client runtime never imports strategies; a strategy may import its client role's module
(``client_app.roles``) for the arguments and the array names the two share.
"""

from .options import MethodOptions, OptionError, option, sent
from .role_args import RoleArgs, RoleArgsError
from .wire import (
    STATE_EXTRA_PREFIX,
    WIRE_EXTRA_PREFIX,
    SpecError,
    TaskSpec,
)

__all__ = [
    "STATE_EXTRA_PREFIX",
    "WIRE_EXTRA_PREFIX",
    "MethodOptions",
    "OptionError",
    "RoleArgs",
    "RoleArgsError",
    "SpecError",
    "TaskSpec",
    "option",
    "sent",
]
