"""Server-side strategies: one file per method on the shared :class:`PersonalizedStrategy` base."""

from __future__ import annotations

import inspect
from typing import Any

from .base import PersonalizedStrategy
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

STRATEGIES: dict[str, type[PersonalizedStrategy]] = {
    cls.name: cls for cls in (FedAvg, FedPer, Local, FedCMD, FedProx, FedRep, FedBabu, FedBN, LGFedAvg, PFedSim, Ditto)
}
STRATEGIES.update({cls.name: cls for cls in (FedAMP, CFL, FedDyn, FedFomo, FedAP, MOON, PFedLA, FedCPMD, KAPC, KAPCBLS, FedTSDP, Felo, Velo, FedHe)})


def method_options(name: str) -> list[str]:
    """The method-specific keyword arguments a strategy accepts (its conf/method/ keys)."""
    options: list[str] = []
    for cls in STRATEGIES[name].__mro__:  # a subclass passing **kwargs on takes its parents' options too (Velo: Felo's)
        if cls is PersonalizedStrategy or "__init__" not in vars(cls):
            continue
        params = inspect.signature(cls.__init__).parameters
        options += [p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY and p not in _BASE_OPTIONS and p not in options]
        if not any(v.kind is inspect.Parameter.VAR_KEYWORD for v in params.values()):
            break
    return options


_BASE_OPTIONS = set(
    p for p, v in inspect.signature(PersonalizedStrategy.__init__).parameters.items()
    if v.kind is inspect.Parameter.KEYWORD_ONLY
)


def build_strategy(name: str, *args: Any, method_args: dict[str, Any] | None = None, **kwargs: Any) -> PersonalizedStrategy:
    """Instantiate a registered method; unknown names or options get a message listing the valid ones."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown method {name!r}; valid methods: {sorted(STRATEGIES)}")
    method_args = dict(method_args or {})
    valid = method_options(name)
    unknown = sorted(set(method_args) - set(valid))
    if unknown:
        raise ValueError(f"method {name!r} has no option(s) {unknown}; its options: {valid or 'none'}")
    return STRATEGIES[name](*args, **kwargs, **method_args)


__all__ = ["STRATEGIES", "PersonalizedStrategy", "build_strategy", "method_options"]
