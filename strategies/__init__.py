"""The methods as Flower strategies: ``from pflower.strategies import FedCMD, FedPer, KAPC``.

One file per method here, on the shared :class:`PersonalizedStrategy` (``base/``, with its parts;
``shared/``: math several methods share). A method registers itself by subclassing the base with
its own ``name`` (no list to edit): importing this package imports every module in it.

Public: the method classes below, :class:`PersonalizedStrategy`, :func:`client_spec` (what a
strategy built in your own ServerApp tells its clients), :func:`build_strategy` and the options
helpers. The modules of ``base/`` and ``shared/`` are internal.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from pflower.logs import one_line_user_errors
from pflower.protocol.options import MethodOptions, OptionError

from .base.client_spec import client_spec
from .base.strategy import METHODS, PersonalizedStrategy
from .cfl import CFL
from .ditto import Ditto
from .fedamp import FedAMP
from .fedap import FedAP
from .fedavg import FedAvg
from .fedbabu import FedBabu
from .fedbn import FedBN
from .fedcmd import FedCMD
from .fedcpmd import FedCPMD
from .feddyn import FedDyn
from .fedfomo import FedFomo
from .fedper import FedPer
from .fedprox import FedProx
from .fedrep import FedRep
from .fedtsdp import FedTSDP
from .felo import FedHe, Felo, Velo
from .kapc import KAPC, KAPCBLS
from .lgfedavg import LGFedAvg
from .local import Local
from .moon import MOON
from .pfedla import PFedLA
from .pfedsim import PFedSim

# a method file not listed above registers too, and its class is public as the listed ones are
# (no list to edit: docs/adding-a-method.md); the explicit imports above are for readers and IDEs
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
_LATE = sorted(cls.__name__ for cls in METHODS.values() if cls.__name__ not in globals())
globals().update({cls.__name__: cls for cls in METHODS.values() if cls.__name__ in _LATE})

STRATEGIES: dict[str, type[PersonalizedStrategy]] = dict(sorted(METHODS.items()))


def method_options(name: str) -> list[str]:
    """The method-specific options a strategy accepts (the keys under ``method.``)."""
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
    "CFL",
    "KAPC",
    "KAPCBLS",
    "MOON",
    "Ditto",
    "FedAMP",
    "FedAP",
    "FedAvg",
    "FedBabu",
    "FedBN",
    "FedCMD",
    "FedCPMD",
    "FedDyn",
    "FedFomo",
    "FedHe",
    "FedPer",
    "FedProx",
    "FedRep",
    "FedTSDP",
    "Felo",
    "LGFedAvg",
    "Local",
    "PFedLA",
    "PFedSim",
    "Velo",
    "client_spec",
    "STRATEGIES",
    "MethodOptions",
    "OptionError",
    "PersonalizedStrategy",
    "build_strategy",
    "method_options",
    "options_of",
    *_LATE,
]

one_line_user_errors()  # an option typo in a user's own ServerApp: one line in Flower's log
