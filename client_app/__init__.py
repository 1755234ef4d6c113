"""pflower's client side: local data, the method's client role, persistent personal state.

Public: :func:`build_clientapp` (your model and data as a ClientApp running any method's client
role) and :func:`client_mod` (a Flower mod: your own ClientApp, its ``train`` unchanged, as a
pflower client). The ClientApp of ``flwr run .`` is ``pflower.client_app.app:app``. Everything else here is
internal.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_clientapp", "client_mod"]


def __getattr__(name: str) -> Any:
    # lazy: the SuperExec imports this package for its fork server, which must not load torch
    if name == "build_clientapp":
        from .builder import build_clientapp

        return build_clientapp
    if name == "client_mod":
        from .mod import client_mod

        return client_mod
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
