"""The paired comparison of two entries over the seeds they share.

Two methods run on the same seed see the same partition, model initialisation and client
sampling, so the seed-to-seed swing of a protocol cancels in their per-seed difference. The
comparison is that difference's mean with a two-sided Student-t interval (95 % by default): its
width comes from how consistently one entry beats the other, not from how much each entry
varies on its own, so a noisy entry cannot make a tie out of a consistent gap (the rule it
replaces, "difference <= the two standard deviations added", did).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats


@dataclass(frozen=True)
class Paired:
    """``a - b`` over the ``n`` seeds both have: the mean and its ``level`` interval."""

    mean: float
    low: float
    high: float
    n: int
    level: float = 0.95

    @property
    def contains_zero(self) -> bool:
        """No difference is inside the interval: the two cannot be told apart on these seeds."""
        return self.low <= 0.0 <= self.high

    def text(self, digits: int = 2) -> str:
        """``+0.53 [-0.41, +1.47] (3 seeds)``."""
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}] ({self.n} seeds)"


def mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """The mean of ``values`` and its two-sided Student-t ``level`` interval (two values or more)."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], level: float = 0.95) -> Paired | None:
    """``a - b`` over the seeds both map (seed -> value), with its Student-t ``level`` interval;
    None below two shared seeds, where a difference has no spread to judge it by."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    mean, low, high = mean_interval([float(a[s]) - float(b[s]) for s in seeds], level)
    return Paired(mean, low, high, len(seeds), level)


def welch_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """mean(a) - mean(b) with Welch's two-sided ``level`` interval: for two samples that share no
    pairing (runs on different partitions), two values or more on each side."""
    na, nb = len(a), len(b)
    ma, mb = sum(a) / na, sum(b) / nb
    va = sum((v - ma) ** 2 for v in a) / (na - 1) / na
    vb = sum((v - mb) ** 2 for v in b) / (nb - 1) / nb
    d, se = ma - mb, math.sqrt(va + vb)
    if se == 0:
        return d, d, d
    df = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return d, d - half, d + half
