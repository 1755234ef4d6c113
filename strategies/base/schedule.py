"""Per-round learning rates: the server computes round r's rate and sends it with the round.

Local optimizers are rebuilt every round (the papers' protocol; with ``optimizer_state=kept``
their moments carry over, their rate does not), so a schedule over rounds is
a function of the round number, not optimizer state: Felo/Velo's MultiStepLR (x0.1 at 40 % and
70 % of the rounds, Felo/Velo paper, round schedule) and FedTSDP's exponential decay (0.05 * 0.95^(r-1),
the FedTSDP paper's) are both one line of :meth:`LRSchedule.lr`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KINDS = ("constant", "multistep", "exponential")


@dataclass(frozen=True)
class LRSchedule:
    """``constant``: the base rate every round. ``multistep``: times ``gamma`` after each milestone
    (a round number, or a fraction of ``rounds`` when below 1: round r is decayed once per
    milestone m < r, as torch's MultiStepLR stepped once per round). ``exponential``:
    base * gamma^(r - 1)."""

    kind: str = "constant"
    milestones: tuple[float, ...] = ()
    gamma: float = 0.1
    rounds: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"lr_schedule.kind must be one of {list(KINDS)}, got {self.kind!r}")
        if not self.gamma > 0:
            raise ValueError(f"lr_schedule.gamma must be > 0, got {self.gamma}")
        if any(not m > 0 for m in self.milestones):
            raise ValueError(
                f"lr_schedule.milestones must be > 0 (round numbers, or fractions of the rounds), got "
                f"{list(self.milestones)}"
            )
        if self.kind == "multistep" and any(m < 1 for m in self.milestones) and not self.rounds:
            raise ValueError("lr_schedule: fractional milestones need the run's rounds")

    @classmethod
    def from_config(cls, values: Mapping[str, Any] | None) -> LRSchedule:
        if not values:
            return cls()
        known = {"kind", "milestones", "gamma", "rounds"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"lr_schedule has no key(s) {unknown}; its keys: {sorted(known)}")
        return cls(
            kind=str(values.get("kind", "constant")),
            milestones=tuple(float(m) for m in (values.get("milestones") or ())),
            gamma=float(values.get("gamma", 0.1)),
            rounds=int(values["rounds"]) if values.get("rounds") else None,
        )

    def milestone_rounds(self) -> list[int]:
        """Milestones as round numbers (fractions of ``rounds`` floored, as the Felo/Velo paper's ⌊0.4T⌋)."""
        return [int(m * self.rounds) if m < 1 and self.rounds else int(m) for m in self.milestones]

    def lr(self, base: float, server_round: int) -> float:
        """The learning rate of round ``server_round`` (1-based)."""
        if self.kind == "multistep":
            return base * self.gamma ** sum(1 for m in self.milestone_rounds() if server_round > m)
        if self.kind == "exponential":
            return base * self.gamma ** (server_round - 1)
        return base
