"""``pflower claims write|check``: every claim of the five papers beside the committed runs, with a verdict.

The claims are declared in ``conf/claims.yaml`` (id, paper, the claim in one line, the paper's
number and where it is printed, the rule that gives the verdict, the run sets that test it);
``write`` renders ``docs/claims.md`` from them and the committed run files, ``check`` says
whether the page is current and no judged reason holds a number (``tests/unit/test_claims.py``
runs it). Declared by hand: each claim's wording, the paper's number, the rule and the runs it
reads, and for a judged claim its verdict and reason. Computed: every pflower number on the page
(from the runs' ``summary.json`` and ``metrics.jsonl``) and every other verdict, by the rules in
:mod:`.claim_rules`.

Rules (``rule.kind``):

- ``value``: the mean of ``metric`` over ``runs`` (a glob of run directories, percent) against
  ``paper_value``: reproduced within ``tolerance`` points (default 1.5), else not reproduced
  (``note``, here and for ``above``: what else the reader needs, e.g. where the gap comes from);
- ``values``: several of the paper's numbers (``items``), each held to the tolerance: reproduced
  when all are within it, not reproduced when none is, partly otherwise;
- ``above``: ``runs`` against the strongest of ``others``, paired by seed and decided by
  :func:`.claim_rules.decide` (``margin``: the paper's lead; every effect rests on 3 seeds, however
  wide: the one-seed exception for an effect many seed spreads wide is gone, its spread having been
  the method's own on another protocol rather than the paired difference's);
- ``compare`` (A minus B), ``trend`` (a slope across a sweep; ``b_runs``: of a difference),
  ``ratio`` (the share of a cost saved), ``count`` (how often a mechanism fires, against
  ``expected`` within ``tolerance``) and ``shape`` (orderings at named windows): per-seed effects
  decided by the one procedure of :mod:`.claim_rules` (``setting``: it holds only in another
  setting, at best partly); ``within`` (A minus B inside the paper's ``band``: a claim that a
  difference is small) and ``count`` with ``at_least`` (it fires, no count given);
- ``best_per_client``: for a claim that different clients do best under different options (a
  personal layer each): ``options`` maps an option's name to its runs; each client's accuracy
  (``final_client_acc``, averaged over an option's runs) picks its best option when it beats
  every other by ``margin`` points (default 1.0); reproduced when two options or more are each
  best for at least ``min_share`` of the clients (default 0.1), partly when two or more are best
  for any client, else not reproduced;
- ``judged``: the verdict and its reason as declared, only for a claim no rule expresses yet: the
  reason says why, holds no typed number (``check`` refuses a digit) and the numbers it rests on
  (``numbers``) are computed from the runs;
- ``untested``: nothing here tests it yet (``reason`` says what would);
- ``needs_data``: it needs data this machine cannot reach (``reason`` names it).
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import sys
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pflower.server_app.config import ConfigError, conf_dir

from . import claim_rules as rules
from .report import NOT_A_SETTING, flatten_config, run_config

ROOT = Path(__file__).resolve().parents[1]
PAGE = Path("docs/claims.md")
VERDICTS = {
    "reproduced": "reproduced",
    "partly": "partly",
    "not_reproduced": "not reproduced",
    "untested": "untested",
    "needs_data": "needs data not available here",
}
KINDS = (
    "value",
    "values",
    "above",
    "compare",
    "trend",
    "ratio",
    "count",
    "shape",
    "within",
    "best_per_client",
    "judged",
    "untested",
    "needs_data",
)
PERCENT_METRICS = ("acc",)  # metrics whose summary values are fractions: shown in percent


@dataclass(frozen=True)
class Measured:
    """A metric over a set of runs: its mean, sample SD and how many runs."""

    label: str
    mean: float
    sd: float
    n: int
    of: str = "run"  # what n counts (runs; clients for a per-client spread)

    def text(self) -> str:
        runs = f"{self.n} {self.of}{'s' if self.n != 1 else ''}"
        if self.mean == int(self.mean) and self.sd == 0:  # a count (re-clusterings, a round), the same in every run
            return f"{self.label} **{int(self.mean)}** ({runs}{', each' if self.n > 1 else ''})"
        spread = f" ± {self.sd:.2f}" if self.n > 1 else ""
        return f"{self.label} **{self.mean:.2f}{spread}** ({runs})"


# metric "<key>@second_half" / "<key>@final" / "<key>@jitter_second_half": from metrics.jsonl
SERIES = ("second_half", "final", "jitter_second_half")


def _shrinks(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """FedTSDP's re-clusterings that shrank the shared prefix (fewer shared units than before)."""
    units, out = int(summary.get("units", 0)), []
    for event in summary.get("reclusterings", []):
        if int(event["shared_units"]) < units:
            out.append(event)
        units = int(event["shared_units"])
    return out


# metric "derived:<name>": a number computed from a run's summary.json lists (FedTSDP's events)
DERIVED = {
    "reclusterings": lambda s: len(s.get("reclusterings", [])),
    "final_clusters": lambda s: len(s.get("clusters", [])),
    "stage2_added_clusters": lambda s: sum(
        int(e["num_clusters"]) - int(e["stage1_clusters"]) for e in s.get("reclusterings", [])
    ),
    "first_stage1_clusters": lambda s: int(s["reclusterings"][0]["stage1_clusters"]) if s.get("reclusterings") else 0,
    "max_stage1_clusters": lambda s: max((int(e["stage1_clusters"]) for e in s.get("reclusterings", [])), default=0),
    "layer_shrinks": lambda s: len(_shrinks(s)),
    "first_shrink_round": lambda s: int(_shrinks(s)[0]["round"]) if _shrinks(s) else float("nan"),
}


def run_value(run: Path, metric: str) -> float:
    """One run's ``metric``: a ``summary.json`` key (``key[i]``: the i-th entry of a list or the
    entry ``i`` of a mapping), or from
    ``metrics.jsonl`` ``<key>@second_half`` (the mean of the rounds after the run's midpoint that
    logged ``key``, the Felo/Velo paper's statistic), ``<key>@final`` (its last logged value) or
    ``<key>@rounds:a-b`` (its mean over rounds a..b) or ``<key>@jitter_second_half`` (the mean
    absolute change between consecutive logged values after the midpoint: how noisy the curve is)."""
    key, _, series = metric.rpartition("@")
    if series in SERIES or series.startswith("rounds:"):
        rounds = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        logged = [(int(r["round"]), r[key]) for r in rounds if isinstance(r.get(key), (int, float))]
        if series.startswith("rounds:"):
            first, _, last = series.removeprefix("rounds:").partition("-")
            values = [v for n, v in logged if int(first) <= n <= int(last)]
        elif series in ("second_half", "jitter_second_half"):
            half = max((n for n, _ in logged), default=0) / 2
            values = [v for n, v in logged if n > half]
            if series == "jitter_second_half":
                values = list(np.abs(np.diff(values))) if len(values) > 1 else []
        else:
            values = [v for _, v in logged[-1:]]
        if not values:
            raise ConfigError(f"conf/claims.yaml: {run / 'metrics.jsonl'} logs no {key!r} ({series})")
        return float(np.mean(values))
    summary = json.loads((run / "summary.json").read_text())
    if metric.startswith("derived:"):
        name = metric.removeprefix("derived:")
        if name not in DERIVED:
            raise ConfigError(f"conf/claims.yaml: unknown derived metric {name!r}, use one of {sorted(DERIVED)}")
        return float(DERIVED[name](summary))
    key, _, index = metric.partition("[")
    value = summary.get(key)
    if index and isinstance(value, list):
        position = int(index.rstrip("]"))
        value = value[position] if -len(value) <= position < len(value) else None
    elif index and isinstance(value, dict):  # key[name]: an entry of a mapping (FedCPMD's personal_layers)
        value = value.get(index.rstrip("]"))
    if not isinstance(value, (int, float)):
        raise ConfigError(f"conf/claims.yaml: {run / 'summary.json'} has no number {metric!r}")
    return float(value)


def measure(pattern: str | Sequence[str], metric: str, label: str, root: Path = ROOT) -> Measured:
    """``metric`` (:func:`run_value`) of every finished run under ``pattern`` (a glob of run
    directories, or a list of globs)."""
    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    found = {Path(p) for pat in patterns for p in glob.glob(str(root / pat))}
    runs = sorted(p for p in found if (p / "summary.json").is_file())
    if not runs:
        raise ConfigError(f"conf/claims.yaml: no finished run matches {pattern!r} ({label})")
    values = []
    for run in runs:
        value = run_value(run, metric)
        values.append(value * (100.0 if any(w in metric for w in PERCENT_METRICS) else 1.0))
    arr = np.asarray(values)
    return Measured(label, float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0, len(arr))


def _runs(pattern: str | Sequence[str], root: Path) -> list[Path]:
    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    found = {Path(p) for pat in patterns for p in glob.glob(str(root / pat))}
    return sorted(p for p in found if (p / "summary.json").is_file())


def seed_map(pattern: str | Sequence[str], metric: str, root: Path = ROOT) -> dict[int, float]:
    """``metric`` of each finished run under ``pattern`` by its seed (``config.yaml``), in percent
    for accuracies: what a paired rule compares. Two runs of one seed are refused (narrow the glob)."""
    out: dict[int, float] = {}
    for run in _runs(pattern, root):
        seed = int((yaml.safe_load((run / "config.yaml").read_text()) or {}).get("seed", 0))
        if seed in out:
            raise ConfigError(f"conf/claims.yaml: two runs of seed {seed} match {pattern!r}; narrow the glob")
        value = run_value(run, metric)
        out[seed] = value * (100.0 if any(w in metric for w in PERCENT_METRICS) else 1.0)
    if not out:
        raise ConfigError(f"conf/claims.yaml: no finished run matches {pattern!r}")
    return out


def _direction(rule: Mapping[str, Any]) -> int:
    word = str(rule.get("direction", "higher"))
    if word not in ("higher", "lower", "rises", "falls", "saves"):
        raise ConfigError(f"conf/claims.yaml: direction {word!r}, use higher, lower, rises, falls or saves")
    return -1 if word in ("lower", "falls") else 1


def _side(side: Mapping[str, Any], metric: str, root: Path) -> tuple[dict[int, float], Measured]:
    values = seed_map(side["runs"], side.get("metric", metric), root)
    return values, _measured(side["label"], list(values.values()))


def _measured(label: str, values: Sequence[float]) -> Measured:
    arr = np.asarray(values, dtype=np.float64)
    return Measured(label, float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0, len(arr))


def _seeds_note(effect: rules.Effect | None, need: int, sides: Sequence[Mapping[str, int]]) -> str:
    """What an untested rule is missing: the seeds each side would need."""
    have = [sorted(s) for s in sides]
    return f" (seeds run: {'; '.join(', '.join(map(str, h)) or 'none' for h in have)}; {need} shared needed)"


def _judge_paired(rule: Mapping[str, Any], metric: str, root: Path) -> tuple[str, str, list[Measured]]:
    """``compare``, ``trend``, ``ratio``, ``count`` and ``shape``: per-seed numbers, one procedure."""
    kind, need = rule["kind"], int(rule.get("min_seeds", rules.MIN_SEEDS))
    other = bool(rule.get("setting"))
    margin = float(rule["margin"]) if rule.get("margin") is not None else None
    if kind == "within":
        a, ma = _side(rule["a"], metric, root)
        b, mb = _side(rule["b"], metric, root)
        effect = rules.compare(a, b)
        low, high = (float(v) for v in rule["band"])
        verdict, why = rules.decide_within(effect, low, high, need)
        reason = f"{ma.label} minus {mb.label}: {effect.text(' points') if effect else 'no shared seed'}; {why}"
        if verdict == "untested":
            reason += _seeds_note(effect, need, [a, b])
        return verdict, reason, [ma, mb]
    if kind in ("compare", "ratio"):
        a, ma = _side(rule["a"], metric, root)
        b, mb = _side(rule["b"], metric, root)
        effect = rules.compare(a, b) if kind == "compare" else rules.ratio(a, b)
        verdict, why = rules.decide(effect, _direction(rule), margin, need, other)
        unit = " points" if kind == "compare" else ""
        what = (
            f"{ma.label} minus {mb.label}" if kind == "compare" else f"the share of {mb.label}'s cost {ma.label} saves"
        )
        reason = f"{what}: {effect.text(unit) if effect else 'no shared seed'}; {why}"
        if verdict == "untested":
            reason += _seeds_note(effect, need, [a, b])
        return verdict, reason, [ma, mb]
    if kind == "trend":
        sweep, shown = {}, []
        for point in rule["sweep"]:  # b_runs: the point's value is the difference with those runs
            values, measured = _side(point, metric, root)
            shown.append(measured)
            if point.get("b_runs"):
                base, base_shown = _side(
                    {**point, "label": point.get("b_label", "minus"), "runs": point["b_runs"]}, metric, root
                )
                shown.append(base_shown)
                values = {k: values[k] - base[k] for k in values.keys() & base.keys()}
            sweep[float(point["x"])] = values
        effect = rules.trend(sweep)
        verdict, why = rules.decide(effect, _direction(rule), margin, need, other)
        per = rule.get("per", "unit")
        unit = str(rule.get("unit", "points"))  # what the metric counts (shared_units: units)
        suffix = f" {unit} per {per}" if unit else f" per {per}"  # unit "": a statistic without one (Hopkins' H)
        reason = f"slope {effect.text(suffix) if effect else 'no seed ran every point'}; {why}"
        if verdict == "untested":
            reason += _seeds_note(effect, need, list(sweep.values()))
        return verdict, reason, shown
    if kind == "count":
        fired, measured = _side(rule, metric, root)
        at_least = float(rule["at_least"]) if rule.get("at_least") is not None else None
        verdict, why = rules.decide_count(
            fired, float(rule.get("expected", 0)), float(rule.get("tolerance", 0)), need, at_least
        )
        if verdict == "reproduced" and other:
            verdict, why = "partly", why + ", but only in another setting"
        return verdict, why, [measured]
    if kind == "shape":
        return _judge_shape(rule, metric, root, need, other)
    raise ConfigError(f"conf/claims.yaml: rule kind {kind!r}")


def _judge_shape(
    rule: Mapping[str, Any], metric: str, root: Path, need: int, other: bool
) -> tuple[str, str, list[Measured]]:
    """``shape``: the ordering at named windows, each window's effect paired by seed (or, with
    ``paired: false``, Welch's unpaired difference), decided by :func:`.claim_rules.decide_shape`."""
    effects, directions, shown, pairs = [], [], [], []
    for window in rule["windows"]:
        at = window.get("metric", metric)
        a_side = {
            **rule["a"],
            "label": window.get("a_label", rule["a"]["label"]),
            "runs": window.get("a_runs", rule["a"].get("runs")),
            "metric": at,
        }
        b_side = {
            **rule["b"],
            "label": window.get("b_label", rule["b"]["label"]),
            "runs": window.get("b_runs", rule["b"].get("runs")),
            "metric": window.get("b_metric", at),  # where the two sides log the same thing apart
        }
        a, ma = _side(a_side, metric, root)
        b, mb = _side(b_side, metric, root)
        effects.append(rules.compare(a, b) if rule.get("paired", True) else rules.compare_unpaired(a, b))
        pairs.append(f"{ma.label} minus {mb.label}")
        directions.append(_direction(window))
        shown += [Measured(f"{window['label']} {ma.label}", ma.mean, ma.sd, ma.n), mb]
    margins = [float(w["margin"]) if w.get("margin") is not None else None for w in rule["windows"]]
    verdict, why = rules.decide_shape(effects, directions, need, margins)
    parts = ", ".join(
        f"{w['label']} ({pair}) {e.text(' ' + str(w.get('unit', 'points'))) if e else 'no shared seed'}"
        for w, e, pair in zip(rule["windows"], effects, pairs)
    )
    if verdict == "reproduced" and other:
        verdict, why = "partly", why + ", but only in another setting"
    return verdict, f"{parts}; {why}", shown


def _judge_values(
    rule: Mapping[str, Any], metric: str, root: Path, numbers: list[Measured]
) -> tuple[str, str, list[Measured]]:
    """``values``: several of the paper's numbers (``items``: label, paper_value, runs), each held to
    the tolerance as ``value`` is: reproduced when all are within it, not reproduced when none is,
    partly otherwise (naming which)."""
    tolerance = float(rule.get("tolerance", 1.5))
    need = int(rule.get("min_seeds", rules.MIN_SEEDS))
    got, within, parts = [], [], []
    for item in rule["items"]:
        m = measure(item["runs"], item.get("metric", metric), item["label"], root)
        diff = m.mean - float(item["paper_value"])
        got.append(m)
        within.append(abs(diff) <= tolerance)
        parts.append(f"{item['label']} {diff:+.2f} from the paper's {float(item['paper_value']):g}")
    verdict = "reproduced" if all(within) else "not_reproduced" if not any(within) else "partly"
    if verdict == "reproduced" and rule.get("setting"):
        verdict = "partly"
    reason = f"{'; '.join(parts)} (tolerance {tolerance:g}: {sum(within)} of {len(within)} within)"
    short = [m.label for m in got if m.n < need]
    if short:  # the one seed minimum of every rule: each number the mean of `need` seeds
        verdict = "untested"
        reason += f"; {', '.join(short)} rest(s) on fewer than {need} seeds"
    return verdict, _noted(reason, rule), [*got, *numbers]


def _judge_above(
    rule: Mapping[str, Any], metric: str, root: Path, numbers: list[Measured]
) -> tuple[str, str, list[Measured]]:
    """``above``: the method against the strongest of ``others`` (the highest mean), paired over
    seeds and decided as ``compare`` (:func:`.claim_rules.decide`); ``margin``: the paper's lead."""
    label = rule.get("label", "this method")
    mine = seed_map(rule["runs"], metric, root)
    others = {name: seed_map(p, metric, root) for name, p in rule["others"].items()}
    shown = [_measured(label, list(mine.values())), *(_measured(n, list(v.values())) for n, v in others.items())]
    strongest = max(others, key=lambda n: np.mean(list(others[n].values())))
    need = int(rule.get("min_seeds", rules.MIN_SEEDS))
    margin = float(rule["margin"]) if rule.get("margin") is not None else None
    effect = rules.compare(mine, others[strongest])
    verdict, why = rules.decide(effect, 1, margin, need, bool(rule.get("setting")))
    reason = (
        f"{label} minus the strongest of the {len(others)} others ({strongest}): "
        f"{effect.text(' points') if effect else 'no shared seed'}; {why}"
    )
    if verdict == "untested":
        reason += _seeds_note(effect, need, [mine, others[strongest]])
    return verdict, _noted(reason, rule), [*shown, *numbers]


def client_accuracies(pattern: str | Sequence[str], root: Path = ROOT) -> dict[str, float]:
    """Each client's final accuracy (percent, ``final_client_acc``) averaged over the finished
    runs under ``pattern``; only clients every run evaluated."""
    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    runs = sorted(
        {Path(p) for pat in patterns for p in glob.glob(str(root / pat)) if (Path(p) / "summary.json").is_file()}
    )
    if not runs:
        raise ConfigError(f"conf/claims.yaml: no finished run matches {pattern!r}")
    per_run = []
    for run in runs:
        accs = json.loads((run / "summary.json").read_text()).get("final_client_acc")
        if not isinstance(accs, dict) or not accs:
            raise ConfigError(f"conf/claims.yaml: {run / 'summary.json'} has no final_client_acc (re-run it)")
        per_run.append(accs)
    common = set.intersection(*(set(a) for a in per_run))
    return {cid: 100.0 * float(np.mean([a[cid] for a in per_run])) for cid in sorted(common, key=int)}


def best_per_client(options: Mapping[str, Mapping[str, float]], margin: float) -> Counter[str]:
    """How many clients each option is best for, by at least ``margin`` points over every other
    option (``""`` counts the clients with no such winner)."""
    clients = set.intersection(*(set(accs) for accs in options.values()))
    counts: Counter[str] = Counter({name: 0 for name in options})
    for cid in clients:
        ranked = sorted(((accs[cid], name) for name, accs in options.items()), reverse=True)
        gap = ranked[0][0] - ranked[1][0]
        clear = gap > 0 and gap >= margin  # an exact tie has no best, whatever the margin
        counts[ranked[0][1] if clear else ""] += 1
    return counts


def _judge_best_per_client(rule: Mapping[str, Any], root: Path) -> tuple[str, str, list[Measured]]:
    options = {name: client_accuracies(p, root) for name, p in rule["options"].items()}
    if len(options) < 2:
        raise ConfigError("conf/claims.yaml: best_per_client needs two options or more")
    margin, min_share = float(rule.get("margin", 1.0)), float(rule.get("min_share", 0.1))
    counts = best_per_client(options, margin)
    total = sum(counts.values())
    winners = [name for name in options if counts[name] > 0]
    strong = [name for name in options if counts[name] >= min_share * total]
    verdict = "reproduced" if len(strong) >= 2 else "partly" if len(winners) >= 2 else "not_reproduced"
    split = ", ".join(f"{name} {counts[name]}" for name in options)
    reason = (
        f"best option per client (by {margin:g} point{'' if margin == 1 else 's'} or more) of {total}: {split}, "
        f"no clear best {counts['']}"
        f" (reproduced needs two options each best for {min_share:.0%} of the clients)"
    )
    numbers = []
    for name, accs in options.items():
        values = np.asarray(list(accs.values()))
        sd = float(values.std(ddof=1)) if len(values) > 1 else 0.0
        numbers.append(Measured(f"{name}: mean client", float(values.mean()), sd, len(values), "client"))
    return verdict, _noted(reason, rule), numbers


def _runs_text(m: Measured) -> str:
    return f"{m.n} run{'s' if m.n != 1 else ''}"


def _noted(reason: str, rule: Mapping[str, Any]) -> str:
    """A computed reason with the rule's ``note`` (where a gap comes from), if it has one."""
    return f"{reason}; {rule['note']}" if rule.get("note") else reason


def judge(claim: Mapping[str, Any], root: Path = ROOT) -> tuple[str, str, list[Measured]]:
    """(verdict key, the reason in words, the numbers it rests on) of one declared claim."""
    rule = dict(claim.get("rule") or {})
    kind = rule.get("kind")
    metric = rule.get("metric", "headline_test_before_acc")
    numbers = [measure(n["runs"], n.get("metric", metric), n["label"], root) for n in rule.get("numbers", [])]
    if kind == "value":
        got = measure(rule["runs"], metric, "pflower", root)
        paper, tolerance = float(claim["paper_value"]), float(rule.get("tolerance", 1.5))
        diff = got.mean - paper
        need = int(rule.get("min_seeds", rules.MIN_SEEDS))
        verdict = "reproduced" if abs(diff) <= tolerance else "not_reproduced"
        reason = (
            f"{diff:+.2f} points from the paper's {paper:g} (tolerance {tolerance:g}; the mean of {_runs_text(got)})"
        )
        if got.n < need:  # the one seed minimum of every rule
            verdict, reason = "untested", f"{reason}; rests on {got.n} seed(s), the rule needs {need}"
        elif verdict == "reproduced" and rule.get("setting"):
            verdict, reason = "partly", f"{reason}, but only in another setting: {rule['setting']}"
        if rule.get("setting") and verdict != "partly":  # every verdict names the setting it was judged in
            reason += f" (setting: {rule['setting']})"
        return verdict, _noted(reason, rule), [got, *numbers]
    if kind == "above":
        return _judge_above(rule, metric, root, numbers)
    if kind == "values":
        return _judge_values(rule, metric, root, numbers)
    if kind in ("compare", "trend", "ratio", "count", "shape", "within"):
        verdict, reason, measured = _judge_paired(rule, metric, root)
        if rule.get("setting"):  # every verdict names the setting it was judged in
            reason += f" (setting: {rule['setting']})"
        return verdict, _noted(reason, rule), [*measured, *numbers]
    if kind == "best_per_client":
        verdict, reason, per_option = _judge_best_per_client(rule, root)
        return verdict, reason, [*per_option, *numbers]
    if kind == "judged":
        verdict = rule.get("verdict")
        if verdict not in VERDICTS:
            raise ConfigError(
                f"conf/claims.yaml {claim['id']}: judged verdict {verdict!r}, use one of {list(VERDICTS)}"
            )
        return verdict, str(rule["reason"]), numbers
    if kind in ("untested", "needs_data"):
        return kind, str(rule["reason"]), numbers
    raise ConfigError(f"conf/claims.yaml {claim.get('id')}: rule kind {kind!r}, use one of {list(KINDS)}")


def load_claims(path: Path | None = None) -> dict[str, Any]:
    path = path or conf_dir() / "claims.yaml"
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from exc
    ids = [c["id"] for c in data.get("claims", [])]
    twice = sorted(i for i, n in Counter(ids).items() if n > 1)
    if twice:
        raise ConfigError(f"{path}: claim ids declared twice: {twice}")
    return data


def setup_line(experiment: str) -> str:
    """What an experiment file runs, read from its composed config (never typed): rounds, clients,
    the share a round, the data and its fraction, the split, the model."""
    from pflower.server_app.config import compose_config

    cfg = compose_config([f"experiment={experiment}"])
    data = str(cfg.dataset.name).upper() if cfg.dataset.name in ("fmnist", "mnist") else str(cfg.dataset.name)
    fraction = float(cfg.dataset.get("subsample", 1.0))
    split = str(cfg.partition.name) + (f" α = {cfg.alpha:g}" if cfg.partition.name == "dirichlet" else "")
    model = str(cfg.model.name)
    if model == "mixed":
        archs = [a for a in (cfg.model.get("archs") or {}).values()]
        named = sorted({f"{a['name']}" + (f" {a['fc_layers']}-FC" if a.get("fc_layers") else "") for a in archs})
        model = "mixed architectures (" + ", ".join(named) + ")"
    share = f"{float(cfg.fraction):g} of them a round" if float(cfg.fraction) < 1 else "all of them every round"
    return (
        f"`experiment={experiment}`: {cfg.rounds} rounds, {cfg.num_clients} clients ({share}), {data}"
        + (f" ({fraction:.0%} of it)" if fraction < 1 else "")
        + f", {split}, {model}"
    )


def render(data: Mapping[str, Any], root: Path = ROOT) -> str:
    """The page: how to read it, the count of verdicts per paper, then each paper's claims."""
    papers: dict[str, dict[str, Any]] = dict(data["papers"])
    judged = [(c, *judge(c, root)) for c in data["claims"]]
    lines = [
        "# The papers' claims, and what pflower's runs say",
        "",
        "<!-- generated by `pflower claims write` from conf/claims.yaml and the committed runs: edit those -->",
        "",
        str(data.get("intro", "")).strip(),
        "",
        "| paper | declared | " + " | ".join(VERDICTS.values()) + " |",
        "|---|---|" + "---|" * len(VERDICTS),
    ]
    for key, paper in papers.items():
        counts = Counter(v for c, v, _, _ in judged if c["paper"] == key)
        declared = sum(counts.values())
        total = paper.get("claims_in_paper", declared)
        cells = " | ".join(str(counts.get(v, 0)) for v in VERDICTS)
        lines.append(f"| {paper['short']} | {declared} of {total} | {cells} |")
    every = Counter(v for _, v, _, _ in judged)
    in_papers = sum(int(p.get("claims_in_paper", 0)) for p in papers.values())
    cells = " | ".join(f"**{every.get(v, 0)}**" for v in VERDICTS)
    lines.append(f"| **all** | **{len(judged)} of {in_papers}** | {cells} |")
    for key, paper in papers.items():
        lines += ["", f"## {paper['short']}", "", f"*{paper['title']}*. {str(paper.get('note', '')).strip()}", ""]
        if paper.get("experiments"):
            lines += ["Set-ups of its runs (from the configs):", ""]
            lines += [f"- {setup_line(e)}" for e in paper["experiments"]]
            lines.append("")
        mine = [(c, v, r, n) for c, v, r, n in judged if c["paper"] == key]
        if not mine:
            lines.append("No claim of this paper is declared yet (conf/claims.yaml).")
            continue
        lines += ["| id | claim | the paper | pflower | verdict |", "|---|---|---|---|---|"]
        for claim, verdict, reason, numbers in mine:
            printed = str(claim.get("printed", ""))
            paper_cell = f"{claim['paper_value']:g} ({printed})" if "paper_value" in claim else printed
            ours = "; ".join(m.text() for m in numbers) or "–"
            lines.append(
                f"| {claim['id']} | {claim['claim']} | {paper_cell} | {ours} | **{VERDICTS[verdict]}**: {reason} |"
            )
    return "\n".join(lines).rstrip() + "\n"


def lint(data: Mapping[str, Any]) -> list[str]:
    """What ``check`` refuses besides a stale page: a judged reason with a typed number (a digit),
    since a judged verdict's numbers must come from the runs it names."""
    import re

    problems = []
    for claim in data.get("claims", []):
        rule = claim.get("rule") or {}
        if rule.get("kind") == "judged":
            found = re.findall(r"\S*\d\S*", str(rule.get("reason", "")))
            if found:
                problems.append(
                    f"{claim['id']}: a judged reason holds a typed number ({', '.join(found[:3])}): "
                    "state it by a rule or drop it"
                )
    return problems


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="pflower claims", description="the papers' claims beside the runs")
    parser.add_argument("verb", choices=("write", "check", "unread"))
    parser.add_argument("--page", default=str(PAGE), help="the page's path (default docs/claims.md)")
    args = parser.parse_args(list(argv))
    if args.verb == "unread":
        return print_unread(load_claims(), ROOT)
    try:
        text = render(load_claims())
    except (ConfigError, KeyError, yaml.YAMLError) as exc:
        print(f"pflower claims: {exc}", file=sys.stderr)
        return 2
    page = Path(args.page)
    if args.verb == "write":
        page.write_text(text)
        print(f"wrote {page}")
        return 0
    if not page.is_file() or page.read_text() != text:
        print(f"pflower claims: {page} is not current: run `pflower claims write`", file=sys.stderr)
        return 1
    problems = lint(load_claims())
    if problems:
        print("pflower claims: " + "\n  ".join(["conf/claims.yaml:", *problems]), file=sys.stderr)
        return 1
    missing = runs_without_provenance(ROOT)
    if missing:
        shown = "\n  ".join(str(p) for p in missing[:10]) + (
            f"\n  and {len(missing) - 10} more" if len(missing) > 10 else ""
        )
        print(
            f"pflower claims: {len(missing)} committed run(s) have no provenance.json (where a number came from must "
            f"be on file; write one from the run's own files, null where it cannot be known):\n  {shown}",
            file=sys.stderr,
        )
        return 1
    cited = missing_cited_commits(ROOT)
    if cited:
        print(
            "pflower claims: these pages cite commits this repository does not have (regenerate them, or cite "
            "the commit they were made at):\n  " + "\n  ".join(cited),
            file=sys.stderr,
        )
        return 1
    print(f"{page} is current")
    return 0


GENERATED_AT = re.compile(r"Generated by .* at `?([0-9a-f]{7,40})`?\.")


def missing_cited_commits(root: Path) -> list[str]:
    """``page: commit`` for every ``Generated by ... at <commit>.`` line of the docs whose commit is not
    in this repository (a rewritten history leaves such citations behind); empty outside a git checkout."""
    import subprocess

    if not (root / ".git").exists():
        return []
    missing = []
    for page in sorted((root / "docs").rglob("*.md")):
        for commit in sorted(set(GENERATED_AT.findall(page.read_text(encoding="utf-8")))):
            found = subprocess.run(
                ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=root, capture_output=True, check=False
            )
            if found.returncode != 0:
                missing.append(f"{page.relative_to(root)}: {commit}")
    return missing


def runs_without_provenance(root: Path) -> list[Path]:
    """The committed runs (a ``summary.json`` under ``docs/results``) that have no ``provenance.json``."""
    return sorted(
        s.parent.relative_to(root)
        for s in (root / "docs" / "results").rglob("summary.json")
        if not (s.parent / "provenance.json").is_file()
    )


# what a run's config may hold besides its set-up: the report's keys for where and how a run was
# written, the seed, and the keys of how it was executed (device, checkpoints, timeouts, the
# server's store, deterministic kernels); two runs that differ only in these are seeds of one set-up
EXECUTION_KEYS = frozenset(NOT_A_SETTING) | {
    "seed", "device", "checkpoint_every", "round_timeout", "server_store", "deterministic",
}  # fmt: skip


def setup_of(run: Path) -> tuple[dict[str, Any], Any]:
    """(the run's set-up, its seed): its ``config.yaml`` as dotted keys without :data:`EXECUTION_KEYS`."""
    config = flatten_config(run_config(run))
    return {k: v for k, v in config.items() if k.split(".")[0] not in EXECUTION_KEYS}, config.get("seed")


def same_setup(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two set-ups agree on every key both have: a key only one has was added to the
    config after the other run (``optimizer_state``, ``dataset.transfer_fraction``) at a default
    that keeps the older behaviour (the report's :func:`told_apart` reads them the same way)."""
    return all(a[k] == b[k] for k in a.keys() & b.keys())


def run_sets(rule: Any) -> Iterator[str | list[str]]:
    """Every run set a rule's verdict reads: each value that is a glob under docs/results/ or a list
    of them (not its ``numbers``, shown beside the verdict and not judged)."""

    def is_glob(v: Any) -> bool:
        return isinstance(v, str) and v.startswith("docs/results/")

    if isinstance(rule, dict):
        for key, value in rule.items():
            if key == "numbers":
                continue
            if is_glob(value) or (isinstance(value, list) and value and all(is_glob(v) for v in value)):
                yield value
            else:
                yield from run_sets(value)
    elif isinstance(rule, list):
        for value in rule:
            yield from run_sets(value)


def unread_runs(data: Mapping[str, Any], root: Path = ROOT) -> list[tuple[str, str, list[Path]]]:
    """(claim id, run set, runs) for every run set that leaves out a committed run of its own
    set-up at a seed it does not read: the other seeds a verdict should rest on (a rerun of a seed
    it reads is not counted)."""
    committed = [
        (s.parent, *setup_of(s.parent))
        for s in sorted((root / "docs" / "results").rglob("summary.json"))
        if (s.parent / "config.yaml").is_file()
    ]
    known = {run: (setup, seed) for run, setup, seed in committed}
    found = []
    for claim in data.get("claims", []):
        for pattern in run_sets(claim.get("rule") or {}):
            read = [known[r] for r in _runs(pattern, root) if r in known]
            names = {(own.get("method.name"), own.get("dataset.name")) for own, _ in read}
            left = []
            for run, setup, seed in committed:
                if (setup.get("method.name"), setup.get("dataset.name")) not in names:
                    continue
                seeds_read = {s for own, s in read if same_setup(setup, own)}
                if seeds_read and seed not in seeds_read:
                    left.append(run)
            if left:
                shown = pattern if isinstance(pattern, str) else " + ".join(pattern)
                found.append((str(claim["id"]), shown, [r.relative_to(root) for r in sorted(left)]))
    return found


def print_unread(data: Mapping[str, Any], root: Path = ROOT) -> int:
    """``pflower claims unread``: the run sets that leave out seeds of their own set-up; 1 if any."""
    found = unread_runs(data, root)
    for claim, pattern, runs in found:
        print(f"{claim}: {pattern} leaves out {len(runs)} run(s) of its set-up at other seeds:")
        print("  " + "\n  ".join(str(r) for r in runs))
    print(f"{len(found)} run set(s) leave out committed seeds of their own set-up")
    return 1 if found else 0
