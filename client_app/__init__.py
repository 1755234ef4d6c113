"""pflower's client side: local data, the method's client role, persistent personal state.

Public: :func:`build_clientapp` (your model and data as a ClientApp running any method's client
role). The ClientApp of ``flwr run .`` is ``pflower.client_app.app:app``. Everything else here is
internal.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_clientapp"]


def __getattr__(name: str) -> Any:
    # lazy: the SuperExec imports this package for its fork server, which must not load torch
    if name == "build_clientapp":
        from .builder import build_clientapp

        return build_clientapp
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
