"""``pflower leaderboard run|status|write``: every method on shared protocols, several seeds, one metric.

``conf/leaderboard.yaml`` says which entries (a method with the options it needs) run on which
protocol (``conf/experiment/protocol_*.yaml``) and with which seeds. Each (protocol, entry, seed)
has a fixed place, ``<out>/runs/<protocol>/<entry>/seed<k>/``, so ``run`` skips what finished,
resumes what stopped (its checkpoint; exact, see docs/configuration.md, "Checkpoint and resume") and starts the
rest, after checking that every one of them can start. ``write`` turns the finished runs into
``docs/leaderboard.md``: per protocol a table (mean ± std over seeds of the one headline metric,
with the budget each entry used: clients trained a round, local work, MiB up and down), the
entries tied with the best marked (a paired interval over shared seeds: :mod:`.paired`),
accuracy-vs-round curves with seed bands and accuracy-vs-MiB points. Every number comes from the
runs' summary.json and metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pflower.server_app.config import ConfigError, conf_dir

from .paired import paired_difference

PLAN_FILE = "leaderboard.yaml"
USAGE = """pflower leaderboard status [PROTOCOL ...]          (what is done, stopped, not started)
       pflower leaderboard run [PROTOCOL ...] [--entries E ...] [--dry-run]
       pflower leaderboard write [--page docs/leaderboard.md]"""


@dataclass(frozen=True)
class Job:
    """One run of the table: an entry of a protocol with one seed, at its fixed place."""

    protocol: str
    experiment: str
    entry: str
    seed: int
    overrides: tuple[str, ...]
    root: Path  # <out>/runs/<protocol>/<entry>/seed<k>: the run directory is the one folder under it

    def config(self) -> list[str]:
        return [
            f"experiment={self.experiment}",
            *self.overrides,
            f"seed={self.seed}",
            f"output_dir={self.root}",
            "progress=false",
        ]

    def run_dir(self) -> Path | None:
        found = sorted(p.parent for p in self.root.glob("*/*/config.yaml"))
        if len(found) > 1:
            raise ConfigError(
                f"{self.root} holds {len(found)} runs; a leaderboard place holds one: remove the extra ones"
            )
        return found[0] if found else None

    def status(self) -> str:
        run = self.run_dir()
        if run is None:
            return "new"
        if (run / "summary.json").exists():
            return "done"
        return "stopped" if (run / "checkpoint.npz").exists() else "broken"


def load_plan(path: Path | None = None) -> dict[str, Any]:
    """conf/leaderboard.yaml, checked: every protocol names an experiment and an entry group that exist."""
    path = path or conf_dir() / PLAN_FILE
    plan = yaml.safe_load(path.read_text()) or {}
    for name, proto in (plan.get("protocols") or {}).items():
        _check_protocol(path, plan, name, proto)
    for group in (plan.get("entries") or {}).values():
        for entry, spec in group.items():
            if spec.get("seeds", "seeds") not in plan or not isinstance(plan[spec.get("seeds", "seeds")], list):
                raise ConfigError(f"{path}: entry {entry} names seeds {spec.get('seeds')!r}, not a list of the plan")
    return plan


def _check_protocol(path: Path, plan: dict[str, Any], name: str, proto: dict[str, Any]) -> None:
    """One protocol of the plan: its entry group and experiment exist, its optional keys are well formed."""
    if proto.get("entries") not in (plan.get("entries") or {}):
        raise ConfigError(
            f"{path}: protocol {name} names entry group {proto.get('entries')!r}, which is not under entries"
        )
    if not (conf_dir() / "experiment" / f"{proto.get('experiment')}.yaml").exists():
        raise ConfigError(
            f"{path}: protocol {name} names experiment {proto.get('experiment')!r}, not in conf/experiment/"
        )
    second = proto.get("second_metric")
    if second is not None and not (isinstance(second, dict) and second.get("key") and second.get("label")):
        raise ConfigError(
            f"{path}: protocol {name}'s second_metric must be {{key: <summary.json key>, label: <column header>}}, "
            f"got {second!r}"
        )
    evaluated = proto.get("evaluated")
    group = (plan.get("entries") or {}).get(proto.get("entries")) or {}
    only = proto.get("only")
    if only is not None and (not isinstance(only, list) or not only or set(only) - set(group)):
        raise ConfigError(
            f"{path}: protocol {name}'s only must list entries of its group {proto.get('entries')!r}; unknown: "
            f"{sorted(set(only) - set(group)) if isinstance(only, list) and only else only!r}"
        )
    other = proto.get("compare_to")
    if other is not None and (other == name or other not in (plan.get("protocols") or {})):
        raise ConfigError(f"{path}: protocol {name}'s compare_to must name another protocol of the plan, got {other!r}")
    if evaluated is not None and (not isinstance(evaluated, dict) or set(evaluated) - set(group)):
        raise ConfigError(
            f"{path}: protocol {name}'s evaluated must map its entries to what they measure; unknown entries: "
            f"{sorted(set(evaluated) - set(group)) if isinstance(evaluated, dict) else evaluated!r}"
        )


def plan_jobs(
    plan: dict[str, Any], root: Path, protocols: Sequence[str] = (), entries: Sequence[str] = ()
) -> list[Job]:
    known = plan.get("protocols") or {}
    unknown = sorted(set(protocols) - set(known))
    if unknown:
        raise ConfigError(f"unknown protocol(s) {unknown}; the leaderboard's: {sorted(known)}")
    jobs = []
    for name, proto in known.items():
        if protocols and name not in protocols:
            continue
        only = proto.get("only")
        for entry, spec in plan["entries"][proto["entries"]].items():
            if (entries and entry not in entries) or (only and entry not in only):
                continue
            for seed in plan[spec.get("seeds", "seeds")]:
                jobs.append(
                    Job(
                        name,
                        proto["experiment"],
                        entry,
                        int(seed),
                        tuple(spec.get("overrides") or ()),
                        root / "runs" / name / entry / f"seed{seed}",
                    )
                )
    return jobs


def check_jobs(jobs: Sequence[Job]) -> None:
    """Every job that still has to run composes, validates and builds its strategy: refuse them all at once
    otherwise."""
    from pflower.server_app.run_plan import plan_run
    from pflower.server_app.runner import check_strategy

    problems = []
    for job in jobs:
        if job.status() != "new":
            continue
        try:
            check_strategy(plan_run(job.config()))
        except ValueError as exc:  # ConfigError is one
            problems.append(f"  {job.protocol}/{job.entry}/seed{job.seed}: {exc}")
    if problems:
        raise ConfigError(
            f"{len(problems)} leaderboard run(s) cannot start, so none was started:\n" + "\n".join(problems)
        )


def run_jobs(jobs: Sequence[Job], dry_run: bool = False) -> list[tuple[Job, str]]:
    """Run what is not done, one after another (each run in this process, its protocol's engine)."""
    from pflower.server_app.run_plan import plan_run
    from pflower.simulation.simulate import simulate

    check_jobs(jobs)
    done = []
    for i, job in enumerate(jobs, 1):
        state = job.status()
        if state == "broken":
            raise ConfigError(
                f"{job.run_dir()} has no checkpoint and no summary: remove it to run {job.entry} seed {job.seed} again"
            )
        action = {"done": "skip (done)", "stopped": "resume", "new": "start"}[state]
        print(f"[{i}/{len(jobs)}] {job.protocol} {job.entry} seed {job.seed}: {action}", flush=True)
        if not dry_run and state != "done":
            overrides = job.config() + ([f"resume={job.run_dir()}"] if state == "stopped" else [])
            simulate(plan_run(overrides))
        done.append((job, action))
    return done


# ---------------------------------------------------------------------------- the page


def run_numbers(run: Path, metric: str, second: str | None = None) -> dict[str, Any]:
    """What the table and figures need from one finished run (``second``: a protocol's second
    metric, None where the run did not write it)."""
    summary = json.loads((run / "summary.json").read_text())
    rounds = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    config = yaml.safe_load((run / "config.yaml").read_text()) or {}
    n = max(len(rounds), 1)
    return {
        "metric": summary.get(metric),
        "seed": int(config.get("seed", 0)),
        "second": summary.get(second) if second else None,
        "final_acc": summary.get("final_acc"),
        "clients": float(np.mean([len(r.get("clients", [])) for r in rounds])) if rounds else 0.0,
        "local": f"{config.get('local_steps')} steps"
        if config.get("local_steps")
        else f"{config.get('local_epochs')} epochs",
        "mib_up": sum(r.get("bytes_up", 0) for r in rounds) / 2**20 / n,
        "mib_down": sum(r.get("bytes_down", 0) for r in rounds) / 2**20 / n,
        "wall_min": float(summary.get("wall_time_s", 0.0)) / 60,
        "curve": [(int(r["round"]), r.get("test_before_acc")) for r in rounds],
        "cum_mib": float(np.sum([r.get("bytes_up", 0) + r.get("bytes_down", 0) for r in rounds]) / 2**20),
    }


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


def protocol_rows(
    jobs: Sequence[Job], metric: str, planned_seeds: dict[str, int], second: str | None = None
) -> list[dict[str, Any]]:
    """One row per entry with finished runs: the metric's mean ± std over seeds (and the
    ``second`` metric's, over the seeds that wrote it), the budget, the runs."""
    by_entry: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        if job.status() == "done":
            by_entry.setdefault(job.entry, []).append(
                {**run_numbers(job.run_dir(), metric, second), "run": job.run_dir()}
            )
    rows = []
    for entry, runs in by_entry.items():
        values = [100 * r["metric"] for r in runs if r["metric"] is not None]
        if not values:
            continue
        mean, std = mean_std(values)
        seconds = [100 * r["second"] for r in runs if r["second"] is not None]
        rows.append(
            {
                "entry": entry,
                "seeds": len(values),
                "planned": planned_seeds.get(entry, len(values)),
                "mean": mean,
                "std": std,
                "second": (*mean_std(seconds), len(seconds)) if seconds else None,
                "final": mean_std([100 * r["final_acc"] for r in runs if r["final_acc"] is not None])[0]
                if any(r["final_acc"] is not None for r in runs)
                else None,
                "clients": float(np.mean([r["clients"] for r in runs])),
                "local": runs[0]["local"],
                "mib_up": float(np.mean([r["mib_up"] for r in runs])),
                "mib_down": float(np.mean([r["mib_down"] for r in runs])),
                "wall": float(np.sum([r["wall_min"] for r in runs])),
                "runs": runs,
            }
        )
    return mark_ties(rows)


def seed_values(row: dict[str, Any], key: str = "metric") -> dict[int, float]:
    """An entry's value on each seed, in percent (``key``: ``metric`` or ``second``)."""
    return {int(r["seed"]): 100 * float(r[key]) for r in row.get("runs", []) if r.get(key) is not None and "seed" in r}


def mark_ties(rows: list[dict[str, Any]], key: str = "metric") -> list[dict[str, Any]]:
    """Sort by mean and mark the ``best`` row (the highest mean among entries with several seeds, when
    any: a one-seed number has no spread to win with), each other row's paired difference with it
    (``vs_best``: :func:`.paired.paired_difference` of the row minus the best over the seeds both
    ran, 95 % interval), and a row ``tie`` when that interval contains 0. An entry sharing fewer
    than two seeds with the best ties nothing (no interval)."""
    rows.sort(key=lambda r: -r["mean"])
    if rows:
        best = next((r for r in rows if r["seeds"] > 1), rows[0])
        for row in rows:
            row["best"] = row is best
            row["vs_best"] = None if row is best else paired_difference(seed_values(row, key), seed_values(best, key))
            row["tie"] = row["vs_best"] is not None and row["vs_best"].contains_zero
    return rows


def table(rows: Sequence[dict[str, Any]], second: str | None = None, evaluated: dict[str, str] | None = None) -> str:
    """The protocol's table; ``second``: the header of a second metric's column (mean ± std over
    the seeds that wrote it, '-' for an entry that does not measure it); ``evaluated``: what model
    each entry's numbers measure (a column after the entry, when the protocol says)."""
    extra = [second] if second else []
    head = [
        "entry",
        *(["evaluated model"] if evaluated else []),
        "seeds",
        "headline (mean ± std)",
        "minus the best, paired (95 % CI)",
        *extra,
        "final (all clients)",
        "clients / round",
        "local work",
        "MiB up / down a round",
        "CPU time",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(rows):
        mark = " (best)" if r.get("best", i == 0) else (" (tie)" if r.get("tie") else "")
        seeds = (
            f"{r['seeds']}"
            + (f" of {r['planned']}" if r["planned"] != r["seeds"] else "")
            + (" (one seed)" if r["planned"] == 1 else "")
        )
        final = "" if r["final"] is None else f"{r['final']:.2f}"
        cells = []
        if second:
            got = r.get("second")
            cells = [
                "-"
                if got is None
                else f"{got[0]:.2f} ± {got[1]:.2f}" + (f" ({got[2]} seeds)" if got[2] != r["seeds"] else "")
            ]
        lines.append(
            " | ".join(
                [
                    f"| {r['entry']}{mark}",
                    *([evaluated.get(r["entry"], "-")] if evaluated else []),
                    seeds,
                    f"{r['mean']:.2f} ± {r['std']:.2f}",
                    "-" if r.get("vs_best") is None else r["vs_best"].text(),
                    *cells,
                    final,
                    f"{r['clients']:.1f}",
                    r["local"],
                    f"{r['mib_up']:.2f} / {r['mib_down']:.2f}",
                    f"{r['wall']:.0f} min |",
                ]
            )
        )
    return "\n".join(lines)


def verdict(rows: Sequence[dict[str, Any]]) -> str:
    """Who wins on a protocol, and who is tied with it (the paired interval), in words from the numbers."""
    if not rows:
        return "No finished runs yet."
    best = next((r for r in rows if r.get("best")), rows[0])
    ties = [r["entry"] for r in rows if r.get("tie")]
    text = f"Best: **{best['entry']}**, {best['mean']:.2f} ± {best['std']:.2f} over {best['seeds']} seed(s)."
    if best["seeds"] < 2:
        return text + " One seed only: no spread to compare with."
    above = [r for r in rows if r["seeds"] < 2 and r["mean"] > best["mean"]]
    if above:
        text += (
            " Above it on one seed only (no spread, so not a win): "
            + ", ".join(f"{r['entry']} {r['mean']:.2f}" for r in above)
            + "."
        )
    if ties:
        text += (
            " Tied with it (the paired 95 % interval of the difference contains 0, so not a win either way): "
            + ", ".join(ties)
            + "."
        )
    else:
        text += " Every other entry with several seeds is behind it (its paired 95 % interval excludes 0)."
    return text


def standing(row: dict[str, Any]) -> str:
    return "best" if row.get("best") else ("tie" if row.get("tie") else "behind")


def compare_protocols(rows: Sequence[dict[str, Any]], other_rows: Sequence[dict[str, Any]], other: str) -> str:
    """Whether a verdict changes between two protocols (e.g. the same split at 200 and at 100 rounds):
    on the entries both have finished on every planned seed, each entry's standing (best, tie, behind:
    :func:`mark_ties` on those entries alone) on either, a table of both, and the entries whose standing
    differs."""

    def complete(source: Sequence[dict[str, Any]]) -> set[str]:  # every planned seed finished
        return {r["entry"] for r in source if r["seeds"] >= r.get("planned", r["seeds"])}

    common = complete(rows) & complete(other_rows)
    if not common:
        return f"Against `{other}`: no entry has finished every planned seed on both yet."

    def subset(source: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        picked = mark_ties([dict(r) for r in source if r["entry"] in common])
        return {r["entry"]: r for r in picked}

    here, there = subset(rows), subset(other_rows)
    changed = [e for e in here if standing(here[e]) != standing(there[e])]
    lines = [
        f"Against `{other}`, on the {len(common)} entries both have finished on every planned seed (best and ties "
        "marked among these alone): "
        + (
            "no verdict changes: the same best and the same ties."
            if not changed
            else "the verdict changes for "
            + ", ".join(f"{e} ({standing(there[e])} there, {standing(here[e])} here)" for e in changed)
            + "."
        ),
        "",
        f"| entry | rank here / `{other}` | here (mean ± std, seeds) | `{other}` (mean ± std, seeds) "
        "| standing here / there |",
        "|---|---|---|---|---|",
    ]
    rank_here = {e: i + 1 for i, e in enumerate(here)}  # by mean, as mark_ties sorted them
    rank_there = {e: i + 1 for i, e in enumerate(there)}
    for entry, r in here.items():  # best first, as ranked here
        o = there[entry]
        moved = rank_there[entry] - rank_here[entry]
        lines.append(
            f"| {entry} | {rank_here[entry]} / {rank_there[entry]}"
            + (f" ({'up' if moved > 0 else 'down'} {abs(moved)})" if moved else "")
            + f" | {r['mean']:.2f} ± {r['std']:.2f} ({r['seeds']}) | {o['mean']:.2f} ± {o['std']:.2f} "
            f"({o['seeds']}) | {standing(r)} / {standing(o)} |"
        )
    return "\n".join(lines)


def time_budget(rows: Sequence[dict[str, Any]], done: int, planned: int) -> tuple[float, float | None]:
    """Minutes the finished runs took, and an estimate for the unfinished ones at the mean minutes
    of a finished run (None when nothing finished): how far the table is from done, in one core's time."""
    spent = float(sum(r["wall"] for r in rows))
    return spent, (spent / done * (planned - done) if done else None)


def budget_line(spent: float, left: float | None, unfinished: int, unestimated: int = 0) -> str:
    """``unestimated``: of the ``unfinished``, the runs of protocols with no finished run to estimate from."""
    text = (
        f"Run time of the finished runs: {spent / 60:.1f} h (one core each: one torch thread, the in-process engine)."
    )
    if unfinished and unestimated == unfinished:
        text += f" The {unfinished} unfinished are on protocols with no finished run yet: no estimate."
    elif unfinished and left is not None:
        text += f" The {unfinished} unfinished, at the mean of a finished run: about {left / 60:.1f} h more"
        text += f", not counting {unestimated} of them on protocols with no finished run yet." if unestimated else "."
    return text


SMOOTH = 5  # the curves: a trailing mean over this many rounds (the raw per-round values swing by 10-30 points)
REFERENCES = 2  # the best baselines drawn beside the seed methods
ONE_PANEL = 8  # up to this many entries share one panel


def panel_layout(plan: dict[str, Any], rows: Sequence[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """The accuracy-vs-round figure's panels: ``(title, entries)``: one panel for up to
    :data:`ONE_PANEL` entries; otherwise one per family of the plan's
    ``families`` that has finished entries (entries it does not name go to "other"). The first
    family (the seed methods) gets the :data:`REFERENCES` best entries of the other families
    beside it, so the methods under study meet the strongest baselines in one panel."""
    done = [r["entry"] for r in rows]  # best first
    if len(done) <= ONE_PANEL:
        return [("every entry", done)] if done else []
    panels = panels_by_family(plan, rows)
    if len(panels) > 1 and plan.get("families"):
        first, first_entries = panels[0]
        best_others = [e for e in done if e not in first_entries][:REFERENCES]
        panels[0] = (f"{first} and the {len(best_others)} best others", first_entries + best_others)
    return panels


def line_styles(count: int) -> list[tuple[str, str]]:
    """``count`` (colour, line style) pairs, none repeated: the ten tab10 colours, then the same
    colours dashed, so a panel never shows two curves alike."""
    colours = [f"C{i}" for i in range(10)]
    styles = ["-", "--", "-.", ":"]
    return [(colours[i % 10], styles[(i // 10) % len(styles)]) for i in range(count)]


def seed_curve(row: dict[str, Any]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Rounds every seed has, and the mean and std over the seeds of test_before accuracy (%)."""
    curves = [dict(r["curve"]) for r in row["runs"]]
    rounds = sorted(set.intersection(*(set(c) for c in curves)))
    acc = np.array([[100 * (c[k] or 0.0) for k in rounds] for c in curves])
    return rounds, acc.mean(axis=0), acc.std(axis=0, ddof=1) if len(acc) > 1 else np.zeros(len(rounds))


def plot_protocol(
    name: str, rows: Sequence[dict[str, Any]], out: Path, plan: dict[str, Any] | None = None
) -> list[Path]:
    """Accuracy by round as small multiples (one panel per family, :func:`panel_layout`), each curve
    the mean over seeds smoothed over :data:`SMOOTH` rounds with a ± one std band; and the
    headline against the run's total communication, each point named."""
    import math

    import matplotlib
    import matplotlib.patches
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from .report import rolling_mean

    by_entry = {r["entry"]: r for r in rows}
    panels = panel_layout(plan or {}, rows)
    paths = []
    with matplotlib.style.context("default"):
        ncols = 2 if len(panels) > 1 else 1
        nrows = math.ceil(len(panels) / ncols)
        fig = Figure(figsize=(6.6 * ncols, 3.9 * nrows))
        FigureCanvasAgg(fig)
        axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False).ravel()
        for ax, (title, entries) in zip(axes, panels):
            for entry, (colour, style) in zip(entries, line_styles(len(entries))):
                row = by_entry[entry]
                rounds, mean, std = seed_curve(row)
                mean, std = np.asarray(rolling_mean(list(mean), SMOOTH)), np.asarray(rolling_mean(list(std), SMOOTH))
                label = f"{entry} {row['mean']:.1f}" + (" (1 seed)" if row["seeds"] < 2 else "")
                ax.plot(rounds, mean, color=colour, linestyle=style, linewidth=1.4, label=label)
                ax.fill_between(rounds, mean - std, mean + std, color=colour, alpha=0.12, linewidth=0)
            ax.set_title(title, fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(
                loc="lower right", fontsize=7, frameon=True, framealpha=0.85, title="entry, headline", title_fontsize=7
            )
        for ax in axes[len(panels) :]:
            ax.set_visible(False)
        for ax in axes[: len(panels)]:
            ax.set_xlabel("round")
            ax.set_ylabel("test_before accuracy (%)")
            ax.label_outer()
        fig.suptitle(
            f"{name}: test_before accuracy by round (mean over seeds, {SMOOTH}-round trailing mean, band ± 1 std)",
            fontsize=11,
        )
        fig.tight_layout()
        path = out / f"{name}_accuracy_vs_round.png"
        fig.savefig(path, format="png", dpi=100, metadata={"Software": None})
        paths.append(path)

        # the headline and the communication side by side, one line per entry (best at the top): the
        # entries that send the same model every round share a MiB value, so a scatter piles them up
        family = {e: i for i, (_, entries) in enumerate(panels_by_family(plan or {}, rows)) for e in entries}
        titles = [t for t, _ in panels_by_family(plan or {}, rows)]
        order = list(reversed(rows))  # matplotlib's y grows upward: the best row last, at the top
        fig = Figure(figsize=(10, 1.2 + 0.28 * len(order)))
        FigureCanvasAgg(fig)
        acc_ax, mib_ax = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})
        ys = np.arange(len(order))
        for y, row in zip(ys, order):
            colour = f"C{family[row['entry']]}"
            acc_ax.errorbar([row["mean"]], [y], xerr=[row["std"]], fmt="o", color=colour, capsize=3)
            mib_ax.barh([y], [float(np.mean([r["cum_mib"] for r in row["runs"]]))], color=colour, height=0.6)
        acc_ax.set_yticks(ys, [r["entry"] + (" (1 seed)" if r["seeds"] < 2 else "") for r in order], fontsize=8)
        acc_ax.set_xlabel("headline accuracy (%), mean ± std over seeds")
        mib_ax.set_xlabel("total communication of a run, down + up (MiB)")
        for ax in (acc_ax, mib_ax):
            ax.grid(alpha=0.3, axis="x")
        handles = [matplotlib.patches.Patch(color=f"C{i}", label=t) for i, t in enumerate(titles)]
        mib_ax.legend(handles=handles, loc="lower right", fontsize=7, title="family", title_fontsize=7)
        fig.suptitle(f"{name}: headline and communication per entry", fontsize=11)
        fig.tight_layout()
        path = out / f"{name}_accuracy_vs_mib.png"
        fig.savefig(path, format="png", dpi=100, metadata={"Software": None})
        paths.append(path)
    return paths


def panels_by_family(plan: dict[str, Any], rows: Sequence[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """Each finished entry under its family of the plan's ``families`` (in the plan's order, best
    first within; "other" for entries it does not name), families without finished entries left out."""
    families = {str(k): {str(e) for e in v} for k, v in (plan.get("families") or {}).items()}
    done = [r["entry"] for r in rows]
    out = [(title, [e for e in done if e in members]) for title, members in families.items()]
    named = set().union(*families.values()) if families else set()
    out.append(("other", [e for e in done if e not in named]))
    return [(t, e) for t, e in out if e]


def second_verdict(rows: Sequence[dict[str, Any]], label: str) -> str:
    """The verdict on a protocol's second metric, with the same tie rule (entries that measure it)."""
    measured = [
        {**r, "mean": r["second"][0], "std": r["second"][1], "seeds": r["second"][2]} for r in rows if r.get("second")
    ]
    if not measured:
        return ""
    ranked = mark_ties(measured, key="second")
    text = verdict(ranked).replace("Best:", f"On the {label}: best", 1)
    unmeasured = [r["entry"] for r in rows if not r.get("second")]
    return text + (f" Not measured by: {', '.join(unmeasured)}." if unmeasured else "")


def write_page(plan: dict[str, Any], root: Path, page: Path) -> Path:
    """docs/leaderboard.md from the finished runs (figures beside the runs, under ``root``)."""
    import os

    metric = str(plan.get("metric", "headline_test_before_acc"))
    parts = [
        "# Leaderboard: every method on shared protocols",
        "",
        "Generated by `pflower leaderboard write` from the finished runs under "
        f"`{root.as_posix()}/runs/` (the plan: `conf/leaderboard.yaml`; run what is missing with "
        "`pflower leaderboard run`). Metric, the same for every row: "
        f"`{metric}` (the mean test_before accuracy of the sampled clients over the last 10 rounds), "
        "mean ± sample std over seeds. The best row is the highest mean over several seeds; every other row shows "
        "its paired difference with it: the mean over the seeds both ran (the same partitions, initialisation and "
        "sampling) of its value minus the best's, with a 95 % Student-t interval; *tie* when that interval "
        "contains 0, *behind* otherwise (a spread of its own does not make a tie). Figures: accuracy by round in "
        "one panel per family of methods (the first also draws the two "
        "best entries of the others), and the headline beside the run's communication. Budget columns: clients trained "
        "a round (measured from the runs), the local work per "
        "round (config), MiB up and down a round (the messages' arrays), CPU time summed over the seeds (a run's wall "
        "time "
        "on one core: one torch thread, the in-process engine).",
        *(["", str(plan["intro"]).strip()] if plan.get("intro") else []),
    ]
    total_spent, total_left, total_unfinished, unestimated = 0.0, 0.0, 0, 0
    embeds: dict[str, str] = {}  # protocol -> its verdict and table, for the method pages that show it
    protocols = plan.get("protocols") or {}
    computed = {}  # every protocol's runs and rows first: a protocol may be compared with one written after it
    for name, proto in protocols.items():
        jobs = plan_jobs(plan, root, [name])
        planned: dict[str, int] = {}
        for job in jobs:
            planned[job.entry] = planned.get(job.entry, 0) + 1
        second = proto.get("second_metric") or {}
        computed[name] = (jobs, protocol_rows(jobs, metric, planned, second.get("key")))
    for name, proto in protocols.items():
        jobs, rows = computed[name]
        second = proto.get("second_metric") or {}
        done = sum(j.status() == "done" for j in jobs)
        spent, left = time_budget(rows, done, len(jobs))
        total_spent += spent
        total_left += left or 0.0
        total_unfinished += len(jobs) - done
        unestimated += 0 if left is not None else len(jobs) - done
        parts += [
            "",
            f"## {name} (`experiment={proto['experiment']}`)",
            "",
            *([str(proto["note"]).strip(), ""] if proto.get("note") else []),
            f"{done} of {len(jobs)} planned runs finished. {verdict(rows)}"
            + (f" {second_verdict(rows, second['label'])}" if second.get("key") and rows else ""),
            "",
            budget_line(spent, left, len(jobs) - done),
            "",
        ]
        if rows:
            summary = [f"{verdict(rows)}" + (f" {second_verdict(rows, second['label'])}" if second.get("key") else "")]
            embed = "\n\n".join([*summary, table(rows, second.get("label"), proto.get("evaluated"))])
            embeds[name] = embed + f"\n\nFrom [the leaderboard](../leaderboard.md) (`{name}`), generated with it."
            parts.append(table(rows, second.get("label"), proto.get("evaluated")))
            for path in plot_protocol(name, rows, root, plan):
                parts += ["", f"![{path.stem}]({os.path.relpath(path, page.parent)})"]
            commits = sorted({c for r in rows for run in r["runs"] if (c := _commit(run["run"]))})
            parts += ["", "Commits of these runs: " + ", ".join(f"`{c}`" for c in commits) + "."]
        missing = sorted({j.entry for j in jobs if j.status() != "done"})
        if missing:
            parts += ["", "Not finished yet: " + ", ".join(missing) + "."]
        if proto.get("compare_to"):
            parts += ["", compare_protocols(rows, computed[proto["compare_to"]][1], proto["compare_to"])]
    parts[1:1] = [
        "",
        f"The whole plan, all protocols: {budget_line(total_spent, total_left, total_unfinished, unestimated)}",
    ]
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("\n".join(parts) + "\n")
    fill_method_pages(page.parent / "methods", embeds)
    return page


def fill_method_pages(methods: Path, embeds: dict[str, str]) -> list[Path]:
    """Replace each ``<!-- leaderboard:PROTOCOL -->...<!-- /leaderboard:PROTOCOL -->`` block of a
    method page with that protocol's verdict and table (the pages that changed)."""
    import re

    changed = []
    for path in sorted(methods.glob("*.md")) if methods.is_dir() else []:
        text = before = path.read_text()
        for name, embed in embeds.items():
            start, end = f"<!-- leaderboard:{name} -->", f"<!-- /leaderboard:{name} -->"
            text = re.sub(
                re.escape(start) + ".*?" + re.escape(end), lambda _: f"{start}\n{embed}\n{end}", text, flags=re.S
            )
        if text != before:
            path.write_text(text)
            changed.append(path)
    return changed


def _commit(run: Path) -> str | None:
    from pflower.server_app.provenance import short_commit

    return short_commit(run)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="pflower leaderboard", usage=USAGE)
    parser.add_argument("verb", choices=("status", "run", "write"))
    parser.add_argument("protocols", nargs="*")
    parser.add_argument("--entries", nargs="*", default=[], help="only these entries (labels in conf/leaderboard.yaml)")
    parser.add_argument("--dry-run", action="store_true", help="run: say what would run, run nothing")
    parser.add_argument("--page", default="docs/leaderboard.md", help="write: the page's path")
    parser.add_argument("--root", help="where the runs live (default: the plan's out)")
    try:
        args = parser.parse_intermixed_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        plan = load_plan()
        root = Path(args.root or plan.get("out", "docs/results/leaderboard"))
        if args.verb == "write":
            print(f"wrote {write_page(plan, root, Path(args.page))}")
            return 0
        jobs = plan_jobs(plan, root, args.protocols, args.entries)
        if args.verb == "status":
            for job in jobs:
                print(f"{job.protocol:<16} {job.entry:<24} seed {job.seed}: {job.status()}")
            return 0
        run_jobs(jobs, dry_run=args.dry_run)
    except ConfigError as exc:
        print(f"pflower leaderboard: {exc}", file=sys.stderr)
        return 2
    return 0
