"""The rules that decide a claim's verdict from runs: pure functions of per-seed numbers.

Every rule reduces a claim to one *effect* measured on each seed (a difference, a slope, a cost
ratio, a count) and decides with one procedure, :func:`decide`, stated once on the claims page:

- fewer seeds than the rule needs (``min_seeds``, 3 unless a rule says why fewer suffice):
  **untested**, naming what is missing;
- the effect's mean goes against the paper's direction, or its 95 % interval lies below the
  paper's margin (where the claim is about the margin): **not reproduced**;
- the direction holds and the interval excludes no effect: **reproduced**, or **partly** when it
  holds only in another setting than the paper's (``setting``);
- the direction holds but the interval includes no effect: **partly**.

A claim about a value (``value`` in :mod:`.claims`) keeps its own test: the paper's number within a
tolerance. Nothing here reads a file: :mod:`.claims` gathers the numbers from the runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .paired import mean_interval, paired_difference, welch_difference

MIN_SEEDS = 3


@dataclass(frozen=True)
class Effect:
    """An effect over seeds: its mean, its ``level`` interval and how many seeds it rests on."""

    mean: float
    low: float
    high: float
    n: int

    def text(self, unit: str = "") -> str:
        if self.n < 2:
            return f"{self.mean:+.2f}{unit} (1 seed)"
        return f"{self.mean:+.2f}{unit} [{self.low:+.2f}, {self.high:+.2f}] ({self.n} seeds)"


def interval(values: Sequence[float], level: float = 0.95) -> Effect:
    """The mean of ``values`` with its two-sided Student-t interval (a point for one value)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    if n < 2:
        return Effect(values[0], values[0], values[0], 1)
    return Effect(*mean_interval(values, level), n)


def decide(
    effect: Effect | None,
    direction: int = 1,
    margin: float | None = None,
    min_seeds: int = MIN_SEEDS,
    other_setting: bool = False,
) -> tuple[str, str]:
    """(verdict key, why in words) for ``effect`` against the paper's ``direction`` (+1: the effect
    is positive, -1: negative) and optional ``margin`` (in the effect's units, the paper's size)."""
    if effect is None or effect.n < min_seeds:
        have = 0 if effect is None else effect.n
        return "untested", f"rests on {have} seed(s), the rule needs {min_seeds}"
    mean, low, high = direction * effect.mean, direction * effect.low, direction * effect.high
    low, high = min(low, high), max(low, high)
    if mean <= 0:
        return "not_reproduced", "the effect goes against the paper's direction"
    size = "" if margin is None else f" and the paper's {abs(margin):g} inside it"
    if margin is not None:
        if high < abs(margin):
            return "not_reproduced", f"the paper's {abs(margin):g} lies above the whole 95 % interval"
        if low > abs(margin):
            return (
                "partly",
                f"the paper's direction, but the whole 95 % interval lies above the paper's {abs(margin):g}",
            )
    scope = "" if margin is not None else " (scored on its direction alone: the rule declares no size)"
    if low > 0:
        if other_setting:
            return "partly", f"holds, its 95 % interval excluding no effect{size}, but only in another setting{scope}"
        return "reproduced", f"the paper's direction, its 95 % interval excluding no effect{size}{scope}"
    return "partly", f"the paper's direction, but its 95 % interval includes no effect{scope}"


def decide_within(effect: Effect | None, low: float, high: float, min_seeds: int = MIN_SEEDS) -> tuple[str, str]:
    """A claim that an effect is small ("about as fast", "changes accuracy little", "keeps the
    accuracy"): the band ``[low, high]`` is the paper's. Reproduced when the whole 95 % interval
    lies inside the band, partly when the mean does but the interval reaches out of it, not
    reproduced when the mean lies outside."""
    if effect is None or effect.n < min_seeds:
        have = 0 if effect is None else effect.n
        return "untested", f"rests on {have} seed(s), the rule needs {min_seeds}"
    band = f"[{low:+g}, {high:+g}]"
    if not low <= effect.mean <= high:
        return "not_reproduced", f"the effect lies outside the paper's band {band}"
    if low <= effect.low and effect.high <= high:
        return "reproduced", f"its 95 % interval lies inside the paper's band {band}"
    return "partly", f"inside the paper's band {band} in the mean, but its 95 % interval reaches out of it"


def compare(a: Mapping[int, float], b: Mapping[int, float]) -> Effect | None:
    """``a - b`` paired over the seeds both ran (same partitions): None without a shared seed."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    if len(seeds) == 1:
        d = float(a[seeds[0]]) - float(b[seeds[0]])
        return Effect(d, d, d, 1)
    paired = paired_difference(a, b)
    assert paired is not None
    return Effect(paired.mean, paired.low, paired.high, paired.n)


def compare_unpaired(a: Mapping[int, float], b: Mapping[int, float]) -> Effect | None:
    """``mean(a) - mean(b)`` with Welch's interval, for runs whose seeds do not pair them (each seed
    draws another partition on each side: FedCPMD-16's two alphas); ``n``: the smaller side."""
    if not a or not b:
        return None
    xa, xb = [float(v) for v in a.values()], [float(v) for v in b.values()]
    n = min(len(xa), len(xb))
    if n < 2:
        d = sum(xa) / len(xa) - sum(xb) / len(xb)
        return Effect(d, d, d, n)
    return Effect(*welch_difference(xa, xb), n)


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ``ys`` on ``xs``."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("a trend needs two x values or more")
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def trend(sweep: Mapping[float, Mapping[int, float]]) -> Effect | None:
    """How a metric moves across a sweep (x -> seed -> value): each seed's least-squares slope
    over the x values it ran, then their mean and interval (units of the metric per unit of x).
    Only seeds that ran every x count, so each slope spans the whole sweep."""
    if len(sweep) < 2:
        raise ValueError("a trend needs two x values or more")
    seeds = sorted(set.intersection(*(set(v) for v in sweep.values())))
    if not seeds:
        return None
    xs = sorted(sweep)
    return interval([slope(xs, [float(sweep[x][s]) for x in xs]) for s in seeds])


def ratio(cost: Mapping[int, float], baseline: Mapping[int, float]) -> Effect | None:
    """``1 - cost / baseline`` per shared seed: the share of the baseline's cost saved."""
    seeds = sorted(set(cost) & set(baseline))
    if not seeds:
        return None
    return interval([1.0 - float(cost[s]) / float(baseline[s]) for s in seeds])


def decide_count(
    fired: Mapping[int, float],
    expected: float = 0.0,
    tolerance: float = 0.0,
    min_seeds: int = MIN_SEEDS,
    at_least: float | None = None,
) -> tuple[str, str]:
    """A mechanism that should fire ``expected`` times (splits, shrinks, triggers): reproduced when
    the mean count over seeds is within ``tolerance`` of it; partly when it fires (or, expected
    never to fire, stays silent on some seeds) but outside the tolerance; not reproduced when it
    never fires though expected to, or fires on every seed though expected never to. With
    ``at_least`` (a claim that it fires, with no count): reproduced when every seed fires that often,
    not reproduced when none does, partly otherwise."""
    if len(fired) < min_seeds:
        return "untested", f"rests on {len(fired)} seed(s), the rule needs {min_seeds}"
    values = [float(v) for v in fired.values()]
    if at_least is not None:  # the paper gives no count, only that it fires: at least this often a run
        hit = sum(v >= at_least for v in values)
        if hit == len(values):
            return "reproduced", f"at least {at_least:g} a run on each of {len(values)} seeds"
        if hit == 0:
            return "not_reproduced", f"fewer than {at_least:g} a run on each of {len(values)} seeds"
        return "partly", f"at least {at_least:g} a run on {hit} of {len(values)} seeds only"
    mean = sum(values) / len(values)
    fired_text = f"{mean:.2f} a run on average ({len(values)} seeds)"
    if abs(mean - expected) <= tolerance:
        return "reproduced", f"{fired_text}, within {tolerance:g} of the paper's {expected:g}"
    if expected > 0 and not any(values):
        return "not_reproduced", f"it never fires (the paper: {expected:g})"
    if expected == 0 and all(values):
        return "not_reproduced", f"it fires on every seed ({mean:.2f} a run), where the paper has none"
    return "partly", f"{fired_text}, beyond {tolerance:g} of the paper's {expected:g}"


def shape(windows: Sequence[tuple[Mapping[int, float], Mapping[int, float]]]) -> list[Effect | None]:
    """A curve's ordering at named windows: ``a - b`` paired per window (:func:`compare`)."""
    return [compare(a, b) for a, b in windows]


def decide_shape(
    effects: Sequence[Effect | None],
    directions: Sequence[int],
    min_seeds: int = MIN_SEEDS,
    margins: Sequence[float | None] | None = None,
) -> tuple[str, str]:
    """Every window reproduced: reproduced; most windows against the paper (their mean going the
    other way, or the paper's margin above their interval): not reproduced; fewer seeds than
    needed in any window: untested; otherwise partly (naming the windows)."""
    margins = list(margins) if margins is not None else [None] * len(effects)
    verdicts = [decide(e, d, m, min_seeds=min_seeds)[0] for e, d, m in zip(effects, directions, margins)]
    if "untested" in verdicts:
        return "untested", decide(next(e for e, v in zip(effects, verdicts) if v == "untested"), 1, None, min_seeds)[1]
    held = [i + 1 for i, v in enumerate(verdicts) if v == "reproduced"]
    if len(held) == len(verdicts):
        if all(m is not None for m in margins):
            return "reproduced", (
                "the ordering holds at every window, each 95 % interval excluding no effect and holding the "
                "paper's size"
            )
        return (
            "reproduced",
            "the ordering holds at every window, each 95 % interval excluding no effect (scored on direction alone "
            "where a window declares no size)",
        )
    against = sum(v == "not_reproduced" for v in verdicts)
    if against == len(verdicts):
        return "not_reproduced", "the ordering goes against the paper at every window"
    if 2 * against > len(verdicts):  # a majority against is not 'partly' (FedCMD-22: 2 of 3)
        return "not_reproduced", f"the ordering goes against the paper at {against} of {len(verdicts)} windows"
    if not held:
        return (
            "partly",
            "the paper's ordering holds in the mean at some windows, at none with its interval excluding no effect",
        )
    return (
        "partly",
        f"the ordering holds with its interval excluding no effect at window(s) {', '.join(map(str, held))} only",
    )
