"""`pflower report [--out DIR] [--smooth N] RUN_DIR...`: compare finished runs.

Without ``--out``: a Markdown comparison table on stdout, with the paper's number beside
ours where conf/paper_results/ has one. With ``--out DIR`` also ``DIR/report.md`` (one
section per (dataset, α) group: its table, its figures, its run directories) and, per
group, two PNG figures with one line per run: ``test_before`` accuracy against the round
(``<dataset>_a<α>_accuracy_vs_round.png``) and against the cumulative communication,
down + up (``..._accuracy_vs_mib.png``).

The output is deterministic: the same runs give byte-identical report.md and PNGs (paths
in report.md are relative to DIR; the PNGs carry no date or software metadata and are
drawn with matplotlib's default style through Agg). Identical bytes need the same
matplotlib and FreeType versions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pflower.server_app.config import conf_dir, method_defaults
from pflower.server_app.provenance import short_commit

COLUMNS = (
    "method",
    "model",
    "dataset",
    "alpha",
    "rounds",
    "ours",
    "metric",
    "paper",
    "diff",
    "last-20",
    "final (all clients)",
    "MiB/round",
    "wall",
    "paper set-up",
)
# what `ours` is, by the summary.json key a paper's numbers compare with
METRIC_NAMES = {
    "headline_test_before_acc": "headline",
    "best_mean_acc": "best round, trained",
    "best_test_before_acc": "best round",
    "mean_cluster_acc": "cluster mean",
    "global_acc_second_half": "global test, 2nd half",
    "final_global_acc": "global test, final",
}
# a metric runs record only since a version, and what an older run is shown with instead (the
# row's metric column says so): best_mean_acc is in every method's summary since KAPC's cube fix
OLDER_METRIC = {"best_mean_acc": "best_test_before_acc"}
OLDER_METRIC_NAMES = {"best_test_before_acc": "best_mean_acc"}
# columns a group's table gets only when one of its runs has the value (Felo/Velo/FedHe: the
# models on the labelled global test set), inserted after "final (all clients)"
GLOBAL_COLUMNS = ("global test final", "global test 2nd half")
# summary.json keys the table needs, with the types they must have (None allowed where a run can lack the value)
SUMMARY_KEYS: dict[str, tuple[type, ...]] = {
    "method": (str,),
    "dataset": (str,),
    "rounds": (int,),
    "headline_test_before_acc": (int, float, type(None)),
    "last20_test_before_acc": (int, float, type(None)),
    "total_mib_down": (int, float),
    "total_mib_up": (int, float),
    "wall_time_s": (int, float),
}
FIGURES = (("round", "accuracy_vs_round"), ("mib", "accuracy_vs_mib"))


class ReportError(ValueError):
    """A run's file cannot be used; the message names the file and what is wrong with it."""


def find_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Run directories (holding summary.json) at or below each path, sorted."""
    paths = list(paths)
    runs: set[Path] = set()
    for p in map(Path, paths):
        if (p / "summary.json").exists():
            runs.add(p)
        else:
            runs.update(s.parent for s in p.rglob("summary.json"))
    if not runs:
        raise FileNotFoundError(f"no run directory (with summary.json) under {[str(p) for p in paths]}")
    return sorted(runs)


# the set-up a paper table was run with; a run's values come from its config.yaml (or summary.json)
SETUP_KEYS = ("model", "num_clients", "fraction", "rounds", "partition", "subsample")
HEADLINE = "headline_test_before_acc"


@dataclass(frozen=True)
class PaperTable:
    """One table of a paper (conf/paper_results/<file>.yaml): its set-up, the summary.json key
    its numbers compare with (per method), and its numbers by (method, options, dataset, α)."""

    source: str
    home: str  # the file's stem: a method's own paper wins when several tables match
    setup: Mapping[str, Any]
    metric: Mapping[str, str]
    numbers: Mapping[tuple[str, frozenset[tuple[str, str]], str, float], float]

    def metric_of(self, method: str) -> str:
        return self.metric.get(method, self.metric.get("default", HEADLINE))


def parse_entry(key: str) -> tuple[str, frozenset[tuple[str, str]]]:
    """``"fedcpmd distance=w2"`` -> ("fedcpmd", {("distance", "w2")}): a number for a method run
    with those options (a plain name: the method with its defaults, or any control of it)."""
    method, *options = str(key).split()
    pairs = []
    for option in options:
        name, sep, value = option.partition("=")
        if not sep or not name:
            raise ReportError(f"paper results: {key!r} is not '<method> <option>=<value> ...'")
        pairs.append((name, value))
    return method, frozenset(pairs)


def split_key(alpha: Any) -> float | str:
    """A results key under a dataset: a Dirichlet alpha (a number), or a partition's name for the
    splits that have none (``iid``, ``shards``)."""
    try:
        return float(alpha)
    except (TypeError, ValueError):
        return str(alpha)


def _tables_of(path: Path) -> list[PaperTable]:
    data = yaml.safe_load(path.read_text()) or {}
    where = f"conf/paper_results/{path.name}"
    out = []
    for i, table in enumerate(data.get("tables", [data])):
        if not isinstance(table.get("results"), dict):
            raise ReportError(f"{where}: table {i + 1} has no 'results' mapping dataset -> alpha -> method -> accuracy")
        unknown = set(table.get("setup") or {}) - set(SETUP_KEYS)
        if unknown:
            raise ReportError(f"{where}: setup key(s) {sorted(unknown)} unknown; valid: {list(SETUP_KEYS)}")
        metric = table.get("metric", data.get("metric", HEADLINE))
        numbers = {
            (*parse_entry(method), str(dataset), split_key(alpha)): float(value)
            for dataset, by_alpha in table["results"].items()
            for alpha, methods in by_alpha.items()
            for method, value in methods.items()
        }
        out.append(
            PaperTable(
                source=str(table.get("source", data.get("source", path.stem))),
                home=path.stem,
                setup=dict(table.get("setup") or data.get("setup") or {}),
                metric=metric if isinstance(metric, dict) else {"default": str(metric)},
                numbers=numbers,
            )
        )
    return out


def paper_tables() -> list[PaperTable]:
    """Every table of conf/paper_results/*.yaml, files in name order."""
    return [t for path in sorted((conf_dir() / "paper_results").glob("*.yaml")) for t in _tables_of(path)]


def paper_numbers() -> dict[tuple[str, str, float], tuple[float, str]]:
    """(method, dataset, alpha) -> (accuracy %, source) of the methods' plain entries (first table wins)."""
    out: dict[tuple[str, str, float], tuple[float, str]] = {}
    for table in paper_tables():
        for (method, options, dataset, alpha), value in table.numbers.items():
            if not options:
                out.setdefault((method, dataset, alpha), (value, table.source))
    return out


def setup_differences(paper: Mapping[str, Any], ours: Mapping[str, Any]) -> list[str]:
    """``["rounds 3 (paper 200)"]``: each set-up value of the paper's table the run does not share."""
    diffs = []
    for key, want in paper.items():
        have = ours.get(key)
        same = have is not None and (
            math.isclose(float(have), float(want))
            if isinstance(want, (int, float)) and isinstance(have, (int, float))
            else str(have) == str(want)
        )
        if not same:
            diffs.append(f"{key} {'unknown' if have is None else have} (paper {want})")
    return diffs


@dataclass(frozen=True)
class PaperMatch:
    value: float | None  # None: the set-up differs, see ``differs``
    source: str
    metric: str
    differs: tuple[str, ...]


def paper_match(summary: Mapping[str, Any], tables: Sequence[PaperTable]) -> PaperMatch | None:
    """The paper number for a run: from a table with an entry for its method (and options), whose
    set-up the run shares; a method's own paper first. Without such a table, the closest one's
    differences (no number: a 3-round run is not compared with a 200-round table)."""
    alpha = summary.get("alpha")
    key = float(alpha) if alpha is not None else summary.get("partition")
    if key is None:
        return None
    method, dataset = summary["method"], summary["dataset"]
    options = frozenset((k, str(v)) for k, v in (summary.get("changed_options") or {}).items())
    candidates = []
    for table in tables:
        entries = [
            (opts, v) for (m, opts, d, a), v in table.numbers.items() if m == method and d == dataset and a == key
        ]
        usable = sorted(((len(opts), v) for opts, v in entries if opts <= options), reverse=True)  # most options first
        if usable:
            matched, value = usable[0]
            diffs = setup_differences(table.setup, summary.get("setup") or {})
            candidates.append((len(diffs), -matched, table.home != method, len(candidates), table, value, diffs))
    if not candidates:
        return None
    # a full set-up match, then the entry naming most of the run's options, the method's own paper, file order
    *_, table, value, diffs = min(candidates, key=lambda c: c[:4])
    return PaperMatch(None if diffs else value, table.source, table.metric_of(method), tuple(diffs))


# ---------------------------------------------------------------------------- reading runs


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise ReportError(f"{path}: missing; is {path.parent} a finished pflower run directory?")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read ({exc})") from exc


def _is_type(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # JSON true/false is no number
        return bool in types
    return isinstance(value, types)


def _json_object(text: str, where: str) -> dict[str, Any]:
    """``text`` parsed as a JSON object; a ReportError naming ``where`` otherwise."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
    if not isinstance(value, dict):
        raise ReportError(f"{where}: holds a JSON {type(value).__name__}, not an object")
    return value


def load_summary(run: str | Path) -> dict[str, Any]:
    """A run's summary.json, checked for the keys the report needs."""
    path = Path(run) / "summary.json"
    summary = _json_object(_read_text(path), str(path))
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    if missing:
        raise ReportError(f"{path}: missing key(s) {missing}")
    for key, types in SUMMARY_KEYS.items():
        if not _is_type(summary[key], types):
            want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ReportError(f"{path}: {key} is {summary[key]!r}, not {want}")
    for key in ("alpha", "final_acc"):
        if summary.get(key) is not None and not _is_type(summary[key], (int, float)):
            raise ReportError(f"{path}: {key} is {summary[key]!r}, not a number or null")
    summary["changed_options"] = changed_method_options(run, summary["method"])
    summary["setup"] = run_setup(run, summary)
    for key, value in global_numbers(run).items():  # runs written before the summary carried them
        summary.setdefault(key, value)
    return summary


def global_numbers(run: str | Path) -> dict[str, float]:
    """``final_global_acc`` and ``global_acc_second_half`` from the rounds of metrics.jsonl that
    evaluated the group models on the global test set (Felo/Velo's ``global_acc``)."""
    from pflower.strategies.base.evaluation import global_test_numbers

    path = Path(run) / "metrics.jsonl"
    if not path.exists():
        return {}
    records = []
    for n, line in enumerate(_read_text(path).splitlines(), start=1):
        if '"global_acc"' in line:  # only these lines: the table needs nothing else of metrics.jsonl
            record = _json_object(line, f"{path} line {n}")
            value = record.get("global_acc")
            if value is not None and not _is_type(value, (int, float)):
                raise ReportError(f"{path} line {n}: 'global_acc' is {value!r}, not a number")
            records.append(record)
    return global_test_numbers(records)


def run_setup(run: str | Path, summary: Mapping[str, Any]) -> dict[str, Any]:
    """The run's values of :data:`SETUP_KEYS`, from its config.yaml (summary.json where it has none)."""
    config = Path(run) / "config.yaml"
    cfg: dict[str, Any] = {}
    if config.exists():
        try:
            cfg = yaml.safe_load(config.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ReportError(f"{config}: not valid YAML ({exc})") from exc

    def name(group: str) -> Any:
        value = cfg.get(group)
        return value.get("name") if isinstance(value, dict) else value

    dataset = cfg.get("dataset") if isinstance(cfg.get("dataset"), dict) else {}
    model = cfg.get("model")
    found = {
        "model": (mixed_label(model) if isinstance(model, dict) and model.get("name") == "mixed" else name("model"))
        or summary.get("model"),
        "num_clients": cfg.get("num_clients", summary.get("num_clients")),
        "fraction": cfg.get("fraction"),
        "rounds": summary.get("rounds"),
        "partition": name("partition") or summary.get("partition"),
        "subsample": dataset.get("subsample", 1.0) if cfg else None,
    }
    return {k: v for k, v in found.items() if v is not None}


def mixed_label(model: Mapping[str, Any]) -> str:
    """A heterogeneous federation's model: the conf/model file with the same architectures
    (``resnets_previous``), else ``mixed(<architectures>)``."""
    archs = model.get("archs") or {}
    for path in sorted((conf_dir() / "model").glob("*.yaml")):
        known = yaml.safe_load(path.read_text()) or {}
        if known.get("name") == "mixed" and known.get("archs") == archs and path.stem != "mixed":
            return path.stem
    return f"mixed({','.join(map(str, archs))})"


def changed_method_options(run: str | Path, method: str) -> dict[str, Any]:
    """The run's ``method.<key>`` values that differ from the method's defaults (a control
    such as ``force_layer=fc2`` or ``finetune_epochs=0``), read from its config.yaml."""
    config = Path(run) / "config.yaml"
    if not config.exists() or not (conf_dir() / "method" / f"{method}.yaml").exists():
        return {}
    try:
        used = (yaml.safe_load(config.read_text()) or {}).get("method") or {}
    except yaml.YAMLError as exc:
        raise ReportError(f"{config}: not valid YAML ({exc})") from exc
    default = method_defaults(method)

    def interpolated(value: Any) -> bool:  # e.g. total_rounds: ${rounds}, resolved in the run's copy
        return isinstance(value, str) and "${" in value

    return {
        k: v
        for k, v in used.items()
        if k != "name" and k in default and not interpolated(default[k]) and v != default[k]
    }


def mechanisms() -> dict[str, tuple[Any, ...]]:
    """What shows each method's mechanism at work: the panels its strategy declares
    (``diagnostic_panels``, :class:`strategies.base.diagnostics.Panel`), by method name; drawn by
    :func:`plot_mechanism`, one figure per method and group."""
    from pflower.strategies import STRATEGIES

    return {name: cls.traits.diagnostic_panels for name, cls in STRATEGIES.items() if cls.traits.diagnostic_panels}


def mechanism_keys() -> frozenset[str]:
    """Every record key a mechanism panel reads (its value and its event key)."""
    return frozenset(
        k for panels in mechanisms().values() for p in panels for k in (p.key, p.events, p.threshold_key) if k
    )


@dataclass(frozen=True)
class Curve:
    """A run's rounds with ``test_before`` accuracy (%; None where the round has none), the
    cumulative communication after each round (MiB, down + up), and the mechanism diagnostics
    of :func:`mechanisms` it recorded (key -> one value per round, None where absent)."""

    rounds: tuple[int, ...]
    acc: tuple[float | None, ...]
    mib: tuple[float, ...]
    diagnostics: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)


def _diagnostic(value: Any, key: str, where: str) -> Any:
    """A mechanism value as drawn: a number, a list of numbers, or None; anything else is named."""
    if value is None:
        return None
    if _is_type(value, (int, float)):
        return float(value)
    if isinstance(value, list) and all(_is_type(v, (int, float)) for v in value):
        return tuple(float(v) for v in value)
    raise ReportError(f"{where}: {key!r} is {value!r}, not a number")


def load_curve(run: str | Path) -> Curve:
    """A run's metrics.jsonl as a :class:`Curve`; every line is checked (and named when bad)."""
    path = Path(run) / "metrics.jsonl"
    rounds: list[int] = []
    acc: list[float | None] = []
    mib: list[float] = []
    seen: dict[str, list[Any]] = {}
    total = 0
    keys = mechanism_keys()
    for n, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path} line {n}"
        record = _json_object(line, where)
        rnd = record.get("round")
        if not _is_type(rnd, (int,)):
            raise ReportError(f"{where}: 'round' is {rnd!r}, not an integer")
        if rounds and rnd <= rounds[-1]:
            raise ReportError(f"{where}: round {rnd} after round {rounds[-1]} (rounds must increase)")
        value = record.get("test_before_acc")
        if value is not None and not _is_type(value, (int, float)):
            raise ReportError(f"{where}: 'test_before_acc' is {value!r}, not a number")
        for key in ("bytes_down", "bytes_up"):
            b = record.get(key, 0)
            if not _is_type(b, (int, float)) or b < 0:
                raise ReportError(f"{where}: {key!r} is {b!r}, not a byte count")
            total += b
        for key in keys & record.keys():
            seen.setdefault(key, [None] * len(rounds))
        for key, values in seen.items():
            values.append(_diagnostic(record.get(key), key, where))
        rounds.append(rnd)
        acc.append(None if value is None or math.isnan(value) else 100 * value)
        mib.append(total / 2**20)
    if not rounds:
        raise ReportError(f"{path}: holds no rounds")
    return Curve(tuple(rounds), tuple(acc), tuple(mib), {k: tuple(v) for k, v in seen.items()})


# ---------------------------------------------------------------------------- the table


def run_label(summary: Mapping[str, Any]) -> str:
    """``fedcmd (force_layer=fc2, l*=fc2)``: the method, its options that differ from the
    defaults, and the personal layer FedCMD selected."""
    notes = [f"{k}={v}" for k, v in sorted((summary.get("changed_options") or {}).items())]
    if summary.get("personal_layer"):
        notes.append(f"l*={summary['personal_layer']}")
    notes += resume_notes(summary)
    return summary["method"] + (f" ({', '.join(notes)})" if notes else "")


def resume_notes(summary: Mapping[str, Any]) -> list[str]:
    """How a run was interrupted, for its row: ``resumed after 5`` (exact: the clients kept their
    state), ``CLIENT STATE LOST at 6`` (a forced resume: its numbers differ from an uninterrupted run)."""
    after = summary.get("resumed_after_rounds")
    if after is None and summary.get("resumed_after_round") is not None:
        after = [summary["resumed_after_round"]]
    notes = [f"resumed after {', '.join(str(a) for a in after)}"] if after else []
    lost = summary.get("client_state_lost")
    if lost:
        notes.append(f"CLIENT STATE LOST at {', '.join(str(r) for r in sorted(lost, key=int))}")
    return notes


def wall_text(summary: Mapping[str, Any]) -> str:
    """The run's wall time over all its segments; a run resumed before summaries summed them
    (no ``resumed_after_rounds``) recorded its last segment only, shown as a lower bound."""
    minutes = f"{summary['wall_time_s'] / 60:.1f} min"
    partial = summary.get("resumed_after_round") is not None and "resumed_after_rounds" not in summary
    return f">= {minutes} (last segment)" if partial else minutes


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.2f}"


def _row(s: Mapping[str, Any], tables: Sequence[PaperTable]) -> dict[str, Any]:
    """One table row; ``ours`` is the value of the paper's metric (its headline where no paper
    table has the run's set-up), ``paper``/``diff`` only where the set-up matches."""
    match = paper_match(s, tables)
    metric = match.metric if match is not None and match.value is not None else HEADLINE
    value = s.get(metric)
    label = METRIC_NAMES.get(metric, metric)
    if value is None and metric in OLDER_METRIC:  # a run recorded before every method had the metric
        metric = OLDER_METRIC[metric]
        value, label = (
            s.get(metric),
            f"{METRIC_NAMES.get(metric, metric)} (test_before: the run predates {OLDER_METRIC_NAMES[metric]})",
        )
    ours = 100 * value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    mib = (s["total_mib_down"] + s["total_mib_up"]) / max(s["rounds"], 1)
    paper = match.value if match is not None else None
    return {
        "method": run_label(s),
        "model": (s.get("setup") or {}).get("model", ""),
        "dataset": s["dataset"],
        "alpha": s.get("alpha"),
        "rounds": s["rounds"],
        "ours": "" if ours is None else f"{ours:.2f}",
        "metric": label,
        "paper": "" if paper is None else f"{paper:.2f}",
        "diff": f"{ours - paper:+.2f}" if paper is not None and ours is not None else "",
        "last-20": _pct(s["last20_test_before_acc"]),
        "final (all clients)": _pct(s.get("final_acc")),
        "global test final": _pct(s.get("final_global_acc")),
        "global test 2nd half": _pct(s.get("global_acc_second_half")),
        "MiB/round": f"{mib:.2f}",
        "wall": wall_text(s),
        "paper set-up": ("differs: " + ", ".join(match.differs)) if match is not None and match.differs else "",
    }


def report_rows(runs: Sequence[Path]) -> list[dict[str, Any]]:
    tables = paper_tables()
    rows = [_row(load_summary(run), tables) for run in runs]
    for row, extra in zip(rows, told_apart(runs, rows)):  # two rows that would read the same say how they differ
        if extra:
            row["method"] = f"{row['method']} [{extra}]"
    return rows


# keys of config.yaml that say where or how a run was written, not what it computed
NOT_A_SETTING = (
    "output_dir",
    "resume",
    "resume_force",
    "progress",
    "client_state_dir",
    "workers",
    "backend",
    "batch_clients",
    "ray",
)


def told_apart(runs: Sequence[Path], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """For rows that would read the same (method label, model, dataset, α), what tells their runs
    apart: the config settings that differ among them (``seed=1``), or the run directory's name
    where none does; empty for a row that is alone."""
    key = [(r["method"], r["model"], r["dataset"], r["alpha"]) for r in rows]
    out = [""] * len(rows)
    for k in set(key):
        same = [i for i, other in enumerate(key) if other == k]
        if len(same) < 2:
            continue
        flat = [flatten_config(run_config(runs[i])) for i in same]
        differ = sorted(
            name
            for name in set(flat[0]).intersection(*flat[1:])  # a key only newer runs record is no difference
            if name.split(".")[0] not in NOT_A_SETTING and len({repr(f.get(name)) for f in flat}) > 1
        )
        for i, f in zip(same, flat):
            out[i] = ", ".join(f"{n}={f.get(n)}" for n in differ) if differ else Path(runs[i]).name
    return out


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's leaves by dotted key (``method.mu``)."""
    flat: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, Mapping):
            flat.update(flatten_config(v, f"{prefix}{k}."))
        else:
            flat[f"{prefix}{k}"] = v
    return flat


PAPER_COLUMNS = ("paper", "diff", "paper set-up")
NO_PAPER = (
    "No paper's table in conf/paper_results/ has numbers for these runs' dataset, split and methods, "
    "so the paper columns are left out."
)


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table. Where no row has a paper's number or a set-up note, the paper
    columns are left out and a line under the table says why (rather than blank cells)."""
    columns = list(COLUMNS)
    extra = [c for c in GLOBAL_COLUMNS if any(r.get(c) for r in rows)]
    at = columns.index("final (all clients)") + 1
    columns[at:at] = extra
    no_paper = not any(r.get(c) for r in rows for c in PAPER_COLUMNS)
    if no_paper:
        columns = [c for c in columns if c not in PAPER_COLUMNS]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in rows]
    if no_paper:
        lines += ["", NO_PAPER]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- groups and figures


@dataclass
class Group:
    """Runs of one dataset and α (or one non-Dirichlet partition) read from the same data (the
    fingerprint the run recorded): one table, two figures."""

    dataset: str
    alpha: float | None
    partition: str
    runs: list[tuple[Path, dict[str, Any]]]
    data_sha256: str | None = None  # None: runs from before pflower recorded their data
    name_data: bool = False  # another group has the same dataset and α but other data: say which

    @property
    def data_tag(self) -> str:
        return (self.data_sha256 or "unrecorded")[:8]

    @property
    def stem(self) -> str:
        """File name stem: ``fmnist_a0.1``; ``digits_iid`` for a partition without α (plus the data's
        fingerprint where two groups would share it)."""
        tag = f"a{self.alpha:g}" if self.alpha is not None else self.partition
        data = f"_data-{self.data_tag}" if self.name_data else ""
        return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{self.dataset}_{tag}{data}")

    @property
    def title(self) -> str:
        base = (
            f"{self.dataset}, α = {self.alpha:g}"
            if self.alpha is not None
            else f"{self.dataset}, {self.partition} partition"
        )
        return base + (f", data {self.data_tag}" if self.name_data else "")


def group_runs(runs: Sequence[Path]) -> list[Group]:
    """Runs grouped by (dataset, α, data fingerprint), groups sorted by dataset then α, runs by
    path (the order they are given in does not change the report). Runs of one dataset name that
    read different files (another ``dataset.root``, another release) never share a table; runs
    from before pflower recorded the fingerprint join their dataset's one fingerprinted group."""
    groups: dict[tuple[str, float | None, str, str], Group] = {}
    for run in sorted(set(map(Path, runs))):
        s = load_summary(run)
        alpha = float(s["alpha"]) if s.get("alpha") is not None else None
        partition = "" if alpha is not None else str(s.get("partition") or "unknown")
        sha = s.get("data_sha256") if isinstance(s.get("data_sha256"), str) else None
        key = (s["dataset"], alpha, partition, sha or "")
        groups.setdefault(key, Group(s["dataset"], alpha, partition, [], sha)).runs.append((run, s))
    for key in [k for k in groups if not k[3]]:  # runs that recorded no fingerprint join the one group that did
        recorded = [k for k in groups if k[:3] == key[:3] and k[3]]
        if len(recorded) == 1:
            groups[recorded[0]].runs = sorted(groups[recorded[0]].runs + groups.pop(key).runs, key=lambda r: r[0])
    ordered = [groups[k] for k in sorted(groups, key=lambda k: (k[0], k[1] is None, k[1] or 0.0, k[2], k[3]))]
    for group in ordered:
        group.name_data = (
            sum((g.dataset, g.alpha, g.partition) == (group.dataset, group.alpha, group.partition) for g in ordered) > 1
        )
    return ordered


# top-level config keys a group's runs may differ in that change what a run trains, beyond its
# method options (in the label already) and the table's own columns (model, rounds, alpha)
TRAINING_KEYS = (
    "seed",
    "batch_size",
    "lr",
    "local_epochs",
    "local_steps",
    "momentum",
    "weight_decay",
    "optimizer",
    "optimizer_state",
    "num_clients",
    "fraction",
    "test_fraction",
)


def setup_notes(group: Group) -> list[str]:
    """``, seed 43, batch_size 256`` for each run: every :data:`TRAINING_KEYS` entry (from config.yaml)
    in which the group's runs differ, so two rows of one method never look like one set-up. A key
    some runs' configs predate (an older run has no ``optimizer``) is not a difference; the seed is
    always compared."""
    configs = [run_config(run) for run, _ in group.runs]
    notes = ["" for _ in configs]
    for key in TRAINING_KEYS:
        if key != "seed" and not all(key in c for c in configs):
            continue
        values = [c.get(key) for c in configs]
        if len(set(map(str, values))) > 1:
            notes = [f"{note}, {key} {value}" for note, value in zip(notes, values)]
    return notes


def legend_labels(group: Group) -> list[str]:
    """One label per run: its :func:`run_label`, its model where the group's runs differ in it,
    its seed and training set-up where they differ in those, and the run directory's name where two runs would
    otherwise share a label."""
    labels = [run_label(s) for _, s in group.runs]
    models = [(s.get("setup") or {}).get("model") for _, s in group.runs]
    if len(set(models)) > 1:
        labels = [f"{lab}, {model}" for lab, model in zip(labels, models)]
    labels = [lab + note for lab, note in zip(labels, setup_notes(group))]
    return [f"{lab} [{run.name}]" if labels.count(lab) > 1 else lab for lab, (run, _) in zip(labels, group.runs)]


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start); window 1 = the values."""
    if window < 1:
        raise ValueError(f"rolling window must be >= 1, got {window}")
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def curve_points(curve: Curve, x: str, smooth: int = 1) -> tuple[list[float], list[float]]:
    """(x, accuracy %) of the rounds that have an accuracy; x is the round or the cumulative MiB;
    ``smooth`` > 1: trailing rolling mean over that many of these points."""
    kept = [i for i, a in enumerate(curve.acc) if a is not None]
    xs = [float(curve.rounds[i]) if x == "round" else curve.mib[i] for i in kept]
    ys = rolling_mean([float(curve.acc[i] or 0.0) for i in kept], smooth)
    return xs, ys


STYLES = ("-", "--", ":", "-.")


def plot_group(group: Group, curves: Sequence[Curve], x: str, path: Path, smooth: int = 1) -> Path:
    """One figure: a line per run, accuracy (%) against the round or the cumulative MiB."""
    import matplotlib
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = legend_labels(group)
    with matplotlib.style.context("default"):  # a user's matplotlibrc does not change the bytes
        fig = Figure(figsize=(8, 4.5))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, (label, curve) in enumerate(zip(labels, curves)):
            xs, ys = curve_points(curve, x, smooth)
            style = STYLES[(i // len(colors)) % len(STYLES)]
            ax.plot(xs, ys, label=label, color=colors[i % len(colors)], linestyle=style, linewidth=1.2)
        how = "" if smooth == 1 else f", rolling mean over {smooth} rounds"
        against = "by round" if x == "round" else "against cumulative MiB, one point per round"
        finish_figure(
            fig,
            ax,
            f"{group.title}: test_before accuracy {against}{how}",
            "round" if x == "round" else "cumulative communication, down + up (MiB)",
            "test_before accuracy (%)",
            path,
            whole_rounds=x == "round",
        )
    return path


def finish_figure(
    fig: Any,
    ax: Any,
    title: str,
    xlabel: str,
    ylabel: str,
    path: Path,
    whole_rounds: bool = False,
    legend_size: int = 8,
) -> Path:
    """Title, labels, grid, the legend beside the axes, and a PNG with no date or software in it
    (the same runs give the same bytes). ``whole_rounds``: x ticks on whole rounds only."""
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title)
    ax.set_xlabel(xlabel)
    if whole_rounds:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=legend_size, frameon=False)
    fig.savefig(path, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    return path


def run_config(run: str | Path) -> dict[str, Any]:
    """The run's config.yaml as a dict (empty where the run has none)."""
    config = Path(run) / "config.yaml"
    if not config.exists():
        return {}
    try:
        # libyaml's loader where it is built: the claims check reads every committed run's config
        loaded = yaml.load(config.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except yaml.YAMLError as exc:
        raise ReportError(f"{config}: not valid YAML ({exc})") from exc
    return loaded if isinstance(loaded, dict) else {}


def method_option(run: str | Path, key: str) -> Any:
    """``method.<key>`` from the run's config.yaml (None where the run has none)."""
    method = run_config(run).get("method") or {}
    return method.get(key) if isinstance(method, dict) else None


def run_seed(run: str | Path) -> Any:
    """The run's ``seed`` from its config.yaml (None where it has none)."""
    return run_config(run).get("seed")


def plot_mechanism(group: Group, curves: Sequence[Curve], method: str, path: Path) -> Path | None:
    """The panels of :func:`mechanisms` for ``method``: each of its runs in the group as one line
    (one per entry of a list, e.g. per layer), the threshold option as a dashed line, the
    event rounds (re-clusterings, splits) as dots. None: no run of ``method`` recorded any."""
    panels = mechanisms().get(method, ())
    runs = [
        (label, run, c)
        for label, (run, s), c in zip(legend_labels(group), group.runs, curves)
        if s.get("method") == method and any(p.key in c.diagnostics for p in panels)
    ]
    panels = tuple(p for p in panels if any(p.key in c.diagnostics for _, _, c in runs))
    if not runs or not panels:
        return None
    import matplotlib
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    with matplotlib.style.context("default"):
        fig = Figure(figsize=(8, 2.2 * len(panels) + 0.6))
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
        for ax, panel in zip(axes, panels):
            for i, (label, run, c) in enumerate(runs):
                _draw_panel_run(ax, panel, label, run, c, colors[i % len(colors)])
            ax.set_ylabel(panel.label, fontsize=8)
            ax.grid(alpha=0.3)
        axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
        notes = [
            f"{p.key}: dashed = {p.threshold}" + (f" or {p.threshold_key}" if p.threshold_key else "")
            for p in panels
            if p.threshold
        ]
        notes += [f"dots = {p.events} rounds" for p in panels if p.events]
        title = f"{group.title}: {method}'s mechanism" + (f" ({'; '.join(notes)})" if notes else "")
        axes[0].set_title(title, fontsize=9)
        axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        axes[-1].set_xlabel("round")
        fig.savefig(path, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    return path


def _draw_panel_run(ax: Any, panel: Any, label: str, run: Path, c: Curve, color: str) -> None:
    """One run on one mechanism panel: a line per entry of its values (one per layer...), its
    event rounds as dots, and the threshold it compared with (logged per round, else its option)
    dashed."""
    pts = [(r, v) for r, v in zip(c.rounds, c.diagnostics.get(panel.key, ())) if v is not None]
    if not pts:
        return
    width = max(len(v) if isinstance(v, tuple) else 1 for _, v in pts)
    for j in range(width):
        line = [(r, v[j] if isinstance(v, tuple) else v) for r, v in pts if not isinstance(v, tuple) or j < len(v)]
        ax.plot(
            [r for r, _ in line],
            [y for _, y in line],
            color=color,
            linewidth=1.0,
            alpha=1.0 if width == 1 else 0.35 + 0.65 * (j + 1) / width,
            label=label if j == width - 1 else None,
        )
    if panel.events and width == 1:
        fired = dict(pts)
        xs = [r for r, e in zip(c.rounds, c.diagnostics.get(panel.events, ())) if e and r in fired]
        ax.plot(xs, [fired[r] for r in xs], "o", color=color, markersize=4)
    used = [(r, v) for r, v in zip(c.rounds, c.diagnostics.get(panel.threshold_key or "", ())) if v is not None]
    if used:  # the threshold the run compared with, where it logged one
        xs, ys = [r for r, _ in used], [v for _, v in used]
        ax.plot(xs, ys, color=color, linestyle="--", linewidth=0.8, marker="_", markersize=6)
        return
    limit = method_option(run, panel.threshold) if panel.threshold else None
    if _is_type(limit, (int, float)) and math.isfinite(limit):
        ax.axhline(float(limit), color=color, linestyle="--", linewidth=0.8)


# ---------------------------------------------------------------------------- report.md


def _posix_rel(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path.resolve(), start.resolve())).as_posix()


def _commit_note(run: Path) -> str:
    """`` (seed 42, commit abc1234)`` from the run's config.yaml and provenance.json; each part
    left out for runs made before pflower recorded it."""
    seed, commit = run_seed(run), short_commit(run)
    parts = ([f"seed {seed}"] if seed is not None else []) + ([f"commit {commit}"] if commit else [])
    return f" ({', '.join(parts)})" if parts else ""


def write_report(runs: Sequence[Path], out: str | Path, smooth: int = 1) -> list[Path]:
    """``out/report.md`` and two PNGs per (dataset, α) group; returns the files written.

    Every run is read and checked before anything is written.
    """
    if smooth < 1:
        raise ReportError(f"--smooth must be >= 1 (1 = the raw per-round values), got {smooth}")
    out = Path(out)
    groups = group_runs(runs)
    count = sum(len(g.runs) for g in groups)
    curves = {run: load_curve(run) for g in groups for run, _ in g.runs}
    tables = paper_tables()
    out.mkdir(parents=True, exist_ok=True)
    how = "per round" if smooth == 1 else f"as a trailing rolling mean over {smooth} rounds"
    lines = [
        "# pflower report",
        "",
        f"{count} run(s) in {len(groups)} group(s). `ours`: the run's value of the paper's metric (`metric`; "
        "`headline`: the mean `test_before` accuracy over the last rounds, 10 by default); "
        "`paper`: conf/paper_results/, shown only where the run has the paper table's set-up (model, clients, "
        "fraction, rounds, partition), otherwise `paper set-up` says what differs. Figures: `test_before` "
        f"accuracy {how}, against the round and against the communication so far (bytes down + up, all clients, MiB).",
    ]
    written: list[Path] = []
    for group in groups:
        rows = [_row(s, tables) for _, s in group.runs]
        for row, note in zip(rows, setup_notes(group)):  # the seed and set-up keys the group's runs differ in
            row["method"] += note
        lines += ["", f"## {group.title}", ""]
        if group.data_sha256:  # runs that recorded what they read (older runs did not)
            dirs = sorted({str(s.get("data_dir")) for _, s in group.runs if s.get("data_dir")})
            lines += [
                f"Data: {', '.join(f'`{d}`' for d in dirs) or 'not named'} (sha256 `{group.data_sha256[:16]}`).",
                "",
            ]
        lines += [markdown(rows), ""]
        for x, suffix in FIGURES:
            png = plot_group(
                group, [curves[run] for run, _ in group.runs], x, out / f"{group.stem}_{suffix}.png", smooth
            )
            written.append(png)
            lines.append(f"![{group.title}: accuracy vs {'round' if x == 'round' else 'MiB'}]({png.name})")
        for method in sorted({s.get("method") for _, s in group.runs} & mechanisms().keys()):
            png = plot_mechanism(
                group, [curves[run] for run, _ in group.runs], method, out / f"{group.stem}_{method}_mechanism.png"
            )
            if png is not None:
                written.append(png)
                lines.append(f"![{group.title}: {method}'s mechanism per round]({png.name})")
        lines += ["", "Runs:", ""]
        lines += [
            f"- {label}{_commit_note(run)}: `{_posix_rel(run, out)}`"
            for label, (run, _) in zip(legend_labels(group), group.runs)
        ]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [report, *written]


USAGE = "usage: pflower report [--out DIR] [--smooth N] RUN_DIR_OR_PARENT..."


def main(argv: Sequence[str]) -> int:
    if not argv:
        print(USAGE)
        return 2
    parser = argparse.ArgumentParser(
        prog="pflower report",
        description="Compare finished runs: a Markdown table on stdout; with --out also report.md and plots.",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR_OR_PARENT", help="run directories, or folders holding them")
    parser.add_argument(
        "--out", metavar="DIR", help="also write DIR/report.md and accuracy-vs-round/-MiB PNGs per (dataset, alpha)"
    )
    parser.add_argument(
        "--smooth",
        type=int,
        default=1,
        metavar="N",
        help="plot a trailing rolling mean over N rounds (default 1: the raw per-round values)",
    )
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # argparse has printed why
        return int(exc.code or 0)
    if args.smooth < 1:
        print(
            f"pflower report: --smooth must be >= 1 (1 = the raw per-round values), got {args.smooth}", file=sys.stderr
        )
        return 2
    try:
        runs = find_runs(args.runs)
        table = markdown(report_rows(runs))
        written = write_report(runs, args.out, args.smooth) if args.out is not None else []
        print(table)
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
    except (ReportError, OSError) as exc:  # FileNotFoundError: no runs; OSError: --out cannot be written
        print(f"pflower report: {exc}", file=sys.stderr)
        return 2
    return 0
