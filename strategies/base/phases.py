"""Phase lengths: "the first W rounds" given as rounds or as a share of the run.

FedCMD's Kp (``kp`` or ``rho * K``), pFedSim's and FedAP's warm-up (``warmup`` or
``ratio * K``), FedCPMD's Kp and Felo/Velo's CE-only warm-up (5 % of the rounds) are all one
rule: an explicit number of rounds wins, else a share of the total rounds, rounded the way the
method's paper or reference code does.
"""

from __future__ import annotations

import math

ROUNDINGS = {"floor": math.floor, "round": round, "ceil": math.ceil}


def phase_rounds(
    owner: str,
    rounds: int | None,
    ratio: float | None,
    total_rounds: int | None,
    rounding: str = "floor",
    ratio_name: str = "ratio",
) -> int:
    """The phase length: ``rounds`` if given, else ``rounding(ratio * total_rounds)``.

    ``owner`` and ``ratio_name`` only name the option in the error messages.
    """
    if rounds is not None:
        if rounds < 0:
            raise ValueError(f"{owner} must be >= 0 rounds, got {rounds}")
        return int(rounds)
    if ratio is None or total_rounds is None or not 0.0 <= ratio <= 1.0:
        raise ValueError(f"{owner}: {ratio_name}={ratio} needs 0 <= {ratio_name} <= 1 and total_rounds set")
    return int(ROUNDINGS[rounding](ratio * total_rounds))
