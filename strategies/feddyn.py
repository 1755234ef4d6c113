"""FedDyn (Acar et al., ICLR 2021): FedAvg with a dynamic regularizer; FedCMD paper, hyper-parameters uses alpha = 0.01.

Clients: see :mod:`client_app.roles.feddyn` (loss CE - <g_i, w> + alpha/2 ||w - w_global||^2,
state g_i kept on the client). Server, after each round with clients P (N = all clients):
h <- h - alpha/N * sum_{i in P} (w_i - w_global) and w_global <- mean_{i in P}(w_i) - h/alpha
(the plain mean of the paper, not the sample-weighted one). h starts at 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from typing_extensions import override

from pflower.client_app.roles.feddyn import FedDynArgs

from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate
from .shared.aggregation import weighted_average

Arrays = Mapping[str, np.ndarray]


def feddyn_server_update(
    global_arrays: Arrays, models: Sequence[Arrays], h: Arrays, alpha: float, num_clients: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(new global, new h) from the round's models; keys are those of ``global_arrays``."""
    keys = list(global_arrays)
    mean = weighted_average(models, [1.0] * len(models), keys=keys)
    share = alpha * len(models) / num_clients  # alpha/N * sum_i (w_i - w) = alpha m/N (mean - w)
    new_h = {k: np.asarray(h[k], np.float64) - share * (mean[k].astype(np.float64) - global_arrays[k]) for k in keys}
    new_global = {k: (mean[k] - new_h[k] / alpha).astype(global_arrays[k].dtype) for k in keys}
    return new_global, new_h


class FedDyn(PersonalizedStrategy):
    """FedAvg with a dynamic regularizer and its server state h.
    Its options are its client's: :class:`~pflower.client_app.roles.feddyn.FedDynArgs`."""

    name = "feddyn"
    options_type = FedDynArgs
    traits = MethodTraits(
        role="feddyn",
        state=("h",),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.alpha = self.options.alpha
        self.h = {k: np.zeros(v.shape) for k, v in self.model.global_arrays.items()}

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        models = [u.arrays for u in updates if u.arrays]
        if models:
            self.model.global_arrays, self.h = feddyn_server_update(
                self.model.global_arrays, models, self.h, self.alpha, self.run.num_clients
            )
        return {"h_norm": float(np.sqrt(sum(np.sum(v**2) for v in self.h.values())))}
