"""A client role's arguments: the generic base each role's arguments extend, and its wire form.

A role (``client_app/roles/<name>.py``) declares its arguments as one frozen dataclass extending
:class:`RoleArgs`: the options its client reads, made with :func:`~pflower.protocol.options.option`
(declared, defaulted, documented and checked there and nowhere else; the method's options dataclass
extends the class), and the values its strategy computes, made with
:func:`~pflower.protocol.options.sent` (FedCMD's phase). The strategy base builds one instance per
message from the method's options and ``role_config``'s computed values, which checks them before
anything is sent; the message carries every field as a JSON object; the client decodes it with
:meth:`RoleArgs.from_wire`, the one generic decoder, which refuses a key it does not know and a
field the message lacks (the two sides run different pflower versions) and checks the values
again with the same declaration (a client does not trust a message blindly).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from .options import MethodOptions, OptionError

__all__ = ["RoleArgs", "RoleArgsError"]


class RoleArgsError(OptionError):
    """Role arguments that cannot work, or a message whose arguments this client cannot read."""


@dataclass(frozen=True)
class RoleArgs(MethodOptions):
    """Base of every role's arguments (plain SGD's are :class:`~pflower.client_app.roles.base.SGDArgs`)."""

    def wire(self) -> dict[str, Any]:
        """Every field, options and sent values alike: what the message carries."""
        return asdict(self)

    @classmethod
    def from_wire(cls, values: Mapping[str, Any] | None, role: str) -> RoleArgs:
        """The arguments of ``role`` from a message: exactly this class's fields, each checked."""
        values = dict(values or {})
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise RoleArgsError(
                f"role {role!r} got unknown argument(s) {unknown} (valid: {sorted(known)}); the SuperNode "
                "runs another pflower version than the ServerApp"
            )
        missing = [name for name in known if name not in values]
        if missing:
            raise RoleArgsError(
                f"role {role!r} got no {missing} (a role's arguments travel whole with every message); the "
                "ServerApp runs another pflower version than the SuperNode, or a hand-made message left them out"
            )
        try:
            return cls(**values)
        except OptionError as exc:
            raise RoleArgsError(f"role {role!r}: {exc}", exc.option) from None
