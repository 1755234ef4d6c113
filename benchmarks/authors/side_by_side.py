"""The authors' code, pflower and the paper in one table, from committed run files only.

    python -m benchmarks.authors.side_by_side docs/results/authors_fedcmd --section fedcmd

Reads ``<dir>/authors/<variant>/seed<S>/*_acc_metrics.csv`` (the authors' FL-bench fork writes
``test_before,test_after`` per round, in percent) and ``<dir>/pflower*/seed<S>/**/metrics.jsonl``
(pflower's rounds), takes the paper's statistic (the mean ``test_before`` accuracy of the last
``--last`` rounds: it matches the authors' own logs), and writes ``<dir>/table.md`` and
``<dir>/curves.csv`` (every round of every run, for plotting). The paper's numbers come from
``conf/paper_results/<paper>.yaml``. With ``--section NAME`` the table also replaces the block
between ``<!-- side-by-side:NAME -->`` and ``<!-- /side-by-side:NAME -->`` in docs/authors-code.md.

``--metric final`` is the Felo/Velo layout: the authors' code evaluates each client's own model on
the whole test set every ``--eval_every`` iterations and saves the means in
``authors/<variant>/seed<S>/evaluate_acc.txt`` (beside ``command.txt``, the command that ran it,
which fixes the iterations they belong to); pflower's number is the run's final evaluation of every
client (``final_acc``), and its curve the 10-round means of ``test_before``.

``--metric clusters`` is FedCPMD's layout: the authors' ``fedsper2.py`` writes one
``<clients>_<layer>_<dataset>_acc_metrics.csv`` per cluster (test_before of the cluster's sampled
clients per round, its phase-1 rounds first); pflower logs ``cluster_acc`` per round. Both codes'
clusters are scored alike (:func:`cluster_statistics`): each cluster's mean of its last ``--last``
rounds, then the mean over clusters weighted by their clients ("over clients") and unweighted (the
FedCPMD paper's mean-cluster accuracy).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shlex
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from pflower.server_app.results import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = (20, 50, 100, 150, 200)
#: ``--metric final`` (Felo/Velo): rounds where the authors' code evaluates with ``--eval_every 20``
FINAL_CHECKPOINTS = (21, 61, 101, 141, 200)


def authors_curve(path: Path) -> list[float]:
    """test_before per round, in percent, from the authors' ``*_acc_metrics.csv``."""
    with path.open() as f:
        return [float(row["test_before"]) for row in csv.DictReader(f)]


def pflower_curve(path: Path) -> list[float]:
    """test_before per round, in percent, from a pflower ``metrics.jsonl``."""
    rows = [r for r in read_metrics(path.parent) if "round" in r and "test_before_acc" in r]
    return [100.0 * r["test_before_acc"] for r in sorted(rows, key=lambda r: r["round"])]


def felo_eval_rounds(command: str) -> list[int]:
    """The iterations (1-based) after which the Felo/Velo code evaluates, from its command line:
    ``--epoch E`` (default 100) gives E * 10 clients * 0.2 iterations (``Server_op.py:421``);
    ``--eval_every K`` every K-th from the first, and the last; without it every 1/100 of them."""

    def flag(name: str, default: float) -> float:
        m = re.search(rf"--{name}[ =](\S+)", command)
        return float(m.group(1)) if m else default

    iterations = int(flag("epoch", 100) * flag("clients_number", 10) * flag("clients_sample_ratio", 0.2))
    every = int(flag("eval_every", 0))
    if every:
        return [ep + 1 for ep in range(iterations) if ep % every == 0 or ep == iterations - 1]
    return [ep + 1 for ep in range(iterations) if ep % max(1, iterations // 100) == 0]


def authors_felo_curve(seed_dir: Path) -> dict[int, float]:
    """{iteration: the mean test accuracy (%) of the client models} from the Felo/Velo code's
    ``evaluate_acc.txt`` (fractions), at the iterations its ``command.txt`` gives."""
    values = [float(v) for v in (seed_dir / "evaluate_acc.txt").read_text().split()]
    rounds = felo_eval_rounds((seed_dir / "command.txt").read_text())
    if len(values) != len(rounds):
        raise SystemExit(f"{seed_dir}: {len(values)} evaluations, but its command.txt gives {len(rounds)}")
    return {r: 100.0 * v for r, v in zip(rounds, values)}


#: the one group of a run that forms no clusters
NO_CLUSTERS = "no clustering"


@dataclass(frozen=True)
class Clusters:
    """One clustered run: each cluster's personal layer, its number of clients and its accuracy
    curve (%, one value per round it was scored)."""

    sizes: dict[str, int]
    curves: dict[str, list[float]]


def authors_clusters(seed_dir: Path, dataset: str) -> Clusters:
    """The clusters of one ``fedsper2.py`` run from its ``<clients>_<layer>_<dataset>_acc_metrics.csv`` files."""
    sizes: dict[str, int] = {}
    curves: dict[str, list[float]] = {}
    for path in sorted(seed_dir.glob(f"*_{dataset}_acc_metrics.csv")):
        m = re.fullmatch(rf"(\d+)_(.+)_{re.escape(dataset)}_acc_metrics\.csv", path.name)
        if m:
            if m.group(2) in sizes:  # two runs' files in one folder: which is this seed's is unknowable
                raise SystemExit(f"{seed_dir}: two files for the cluster {m.group(2)!r}: keep one run's files a folder")
            sizes[m.group(2)] = int(m.group(1))
            curves[m.group(2)] = authors_curve(path)
    whole = seed_dir / f"{dataset}_acc_metrics.csv"
    if not sizes and whole.exists():  # a run that forms no clusters (fedsper.py): its clients as one group
        return Clusters({NO_CLUSTERS: 1}, {NO_CLUSTERS: authors_curve(whole)})
    if not sizes:
        raise SystemExit(
            f"{seed_dir}: no <clients>_<layer>_{dataset}_acc_metrics.csv (fedsper2.py writes one a cluster)"
        )
    return Clusters(sizes, curves)


def pflower_clusters(run_dir: Path) -> Clusters:
    """The clusters of one pflower FedCPMD run from the ``cluster_acc`` its rounds log."""
    rows = [r for r in read_metrics(run_dir) if "cluster_acc" in r and "cluster_layers" in r]
    if not rows:
        raise SystemExit(f"{run_dir}: no round logs cluster_acc (not a FedCPMD run, or phase 2 never started)")
    last = max(rows, key=lambda r: r["round"])
    sizes = dict(zip(last["cluster_layers"], last["cluster_sizes"]))
    curves: dict[str, list[float]] = {layer: [] for layer in sizes}
    for row in sorted(rows, key=lambda r: r["round"]):
        for layer, acc in zip(row["cluster_layers"], row["cluster_acc"]):
            if layer in curves and acc is not None:
                curves[layer].append(100.0 * acc)
    return Clusters(sizes, curves)


def cluster_statistics(run: Clusters, last: int) -> tuple[float, float]:
    """(over clients, over clusters): each cluster's mean of its last ``last`` scores, then their
    mean weighted by the clusters' clients, and unweighted (the FedCPMD paper's statistic)."""
    means = {layer: last_mean(curve, last) for layer, curve in run.curves.items() if curve}
    total = sum(run.sizes[layer] for layer in means)
    weighted = sum(run.sizes[layer] * m for layer, m in means.items()) / total
    return weighted, statistics.fmean(means.values())


def cluster_table(root: Path, dataset: str, paper: float | None, last: int, notes: dict[str, str], flags: str) -> str:
    """The ``--metric clusters`` table: every clustered run under ``root``, both statistics per seed."""
    runs: dict[tuple[str, str], dict[int, Clusters]] = {}
    for seed_dir in sorted(root.glob("authors/*/seed*")):
        if list(seed_dir.glob(f"*{dataset}_acc_metrics.csv")):
            runs.setdefault(("authors", seed_dir.parent.name), {})[int(seed_dir.name.removeprefix("seed"))] = (
                authors_clusters(seed_dir, dataset)
            )
    for summary in sorted(root.glob("pflower*/seed*/**/summary.json")):
        seed_dir = next(p for p in summary.parents if p.name.startswith("seed"))
        config = yaml.safe_load((summary.parent / "config.yaml").read_text())
        variant = f"{config['method']['name']} ({config['method'].get('distance', '?')})"
        runs.setdefault(("pflower", variant), {})[int(seed_dir.name.removeprefix("seed"))] = pflower_clusters(
            summary.parent
        )
    lines = [
        f"Metric: each cluster's mean test_before accuracy (%) of its last {last} rounds; then the mean over clusters "
        "weighted by their clients (over clients) and unweighted (over clusters: the FedCPMD paper's mean-cluster "
        "accuracy), per seed. Clusters: personal layer and clients.",
        _generated(root, flags),
        "",
        "| code | method | seeds | clusters | over clients | mean | over clusters | mean | paper |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (code, variant), by_seed in sorted(runs.items()):
        seeds = sorted(by_seed)
        stats = [cluster_statistics(by_seed[s], last) for s in seeds]
        clusters = "; ".join(
            ", ".join(
                layer if layer == NO_CLUSTERS else f"{layer} {n}"
                for layer, n in sorted(by_seed[s].sizes.items(), key=lambda kv: -kv[1])
            )
            for s in seeds
        )
        cells = [code, variant, ", ".join(map(str, seeds)), clusters]
        cells += [", ".join(f"{a:.2f}" for a, _ in stats), f"{statistics.fmean(a for a, _ in stats):.2f}"]
        cells += [", ".join(f"{b:.2f}" for _, b in stats), f"{statistics.fmean(b for _, b in stats):.2f}"]
        cells.append("" if paper is None else f"{paper:g}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += _notes(notes)
    curves = {
        (code, f"{variant} {layer}"): {
            s: dict(enumerate(run.curves[layer], 1)) for s, run in by_seed.items() if layer in run.curves
        }
        for (code, variant), by_seed in runs.items()
        for layer in {layer for run in by_seed.values() for layer in run.curves}
    }
    _write_curves(root, "test_before", curves)
    return "\n".join(lines) + "\n"


def last_mean(curve: list[float], last: int) -> float:
    return statistics.fmean(curve[-last:])


def collect(root: Path, label_options: tuple[str, ...] = ()) -> dict[tuple[str, str], dict[int, list[float]]]:
    """{(code, method or variant): {seed: curve}} for every committed run under ``root``. A pflower
    run is named by its method, plus each of ``label_options`` its method config sets true
    (``fedcmd_relay_phase2``)."""
    runs: dict[tuple[str, str], dict[int, list[float]]] = {}
    for csv_path in sorted(root.glob("authors/*/seed*/*_acc_metrics.csv")):
        variant, seed = csv_path.parts[-3], int(csv_path.parts[-2].removeprefix("seed"))
        runs.setdefault(("authors", variant), {})[seed] = authors_curve(csv_path)
    for jsonl in sorted(root.glob("pflower*/seed*/**/metrics.jsonl")):  # pflower/, pflower_<variant>/
        seed_dir = next(p for p in jsonl.parents if p.name.startswith("seed") and p.parent.name.startswith("pflower"))
        if not (jsonl.parent / "summary.json").exists():  # unfinished: its last rounds are not the run's
            continue
        config = yaml.safe_load((jsonl.parent / "config.yaml").read_text())
        method = config["method"]
        variant = "_".join([method["name"], *(o for o in label_options if method.get(o) is True)])
        runs.setdefault(("pflower", variant), {})[int(seed_dir.name.removeprefix("seed"))] = pflower_curve(jsonl)
    return runs


def collect_final(root: Path) -> dict[tuple[str, str], dict[int, tuple[float, dict[int, float]]]]:
    """``--metric final``: {(code, method or variant): {seed: (final %, {round: %})}}. The authors'
    final is their last evaluation, their curve every evaluation; pflower's final is ``final_acc``,
    its curve the mean ``test_before`` of the 10 rounds ending at each of :data:`FINAL_CHECKPOINTS`."""
    runs: dict[tuple[str, str], dict[int, tuple[float, dict[int, float]]]] = {}
    for acc_file in sorted(root.glob("authors/*/seed*/evaluate_acc.txt")):
        curve = authors_felo_curve(acc_file.parent)
        variant, seed = acc_file.parts[-3], int(acc_file.parts[-2].removeprefix("seed"))
        runs.setdefault(("authors", variant), {})[seed] = (curve[max(curve)], curve)
    for summary_file in sorted(root.glob("pflower*/seed*/**/summary.json")):
        seed_dir = next(p for p in summary_file.parents if p.name.startswith("seed"))
        summary = json.loads(summary_file.read_text())
        method = yaml.safe_load((summary_file.parent / "config.yaml").read_text())["method"]["name"]
        rounds = pflower_curve(summary_file.parent / "metrics.jsonl")
        curve = {c: statistics.fmean(rounds[c - 10 : c]) for c in FINAL_CHECKPOINTS if len(rounds) >= c}
        seed = int(seed_dir.name.removeprefix("seed"))
        runs.setdefault((seed_dir.parent.name, method), {})[seed] = (100.0 * summary["final_acc"], curve)
    return runs


def final_table(root: Path, notes: dict[str, str], flags: str = "") -> str:
    """The ``--metric final`` table (and ``curves.csv``: every evaluation of the authors' runs)."""
    runs = collect_final(root)
    lines = [
        "Metric: the mean test accuracy (%) of the clients' own models after the last round, per seed: the "
        "authors' code scores each of its 10 client models on the whole test set; pflower scores each "
        "client's model on its tenth of it (the run's final evaluation, `final_acc`).",
        f"Rounds {', '.join(map(str, FINAL_CHECKPOINTS))}: the authors' evaluation after that iteration; "
        "pflower's mean `test_before` (the round's 2 clients, own model, own test tenth) of the 10 rounds ending "
        "there.",
        _generated(root, flags),
        "",
        *_head(FINAL_CHECKPOINTS, paper=False),
    ]
    for (code, variant), by_seed in sorted(runs.items()):
        seeds = sorted(by_seed)
        points = [[by_seed[s][1][c] for s in seeds if c in by_seed[s][1]] for c in FINAL_CHECKPOINTS]
        lines.append(_row(code, variant, seeds, [by_seed[s][0] for s in seeds], points))
    lines += _notes(notes)
    _write_curves(root, "accuracy", {key: {s: run[1] for s, run in by_seed.items()} for key, by_seed in runs.items()})
    return "\n".join(lines) + "\n"


def _shown(path: Path) -> str:
    """``path`` relative to the checkout when inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _generated(root: Path, flags: str) -> str:
    """The line naming the command that wrote the table and the commit it ran at."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return f"Generated by `python -m benchmarks.authors.side_by_side {_shown(root)}{flags}` at {commit.stdout.strip()}."


def _head(checkpoints: tuple[int, ...], paper: bool) -> list[str]:
    columns = ["code", "method", "seeds", "per seed", "mean", *(["paper"] if paper else [])]
    columns += [f"r{c}" for c in checkpoints]
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _row(
    code: str, variant: str, seeds: list[int], finals: list[float], points: list[list[float]], paper: str | None = None
) -> str:
    """One table row: per-seed and mean finals, the paper's cell (None: no column), each checkpoint's seed mean."""
    cells = [code, variant, ", ".join(map(str, seeds)), ", ".join(f"{v:.2f}" for v in finals)]
    cells += [f"{statistics.fmean(finals):.2f}", *([] if paper is None else [paper])]
    cells += [f"{statistics.fmean(vals):.2f}" if vals else "" for vals in points]
    return "| " + " | ".join(cells) + " |"


def _write_curves(root: Path, value: str, runs: dict[tuple[str, str], dict[int, dict[int, float]]]) -> None:
    """``<root>/curves.csv``: one line per (code, method, seed, round) of ``runs``' curves ({round: %})."""
    with (root / "curves.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["code", "method", "seed", "round", value])
        for (code, variant), by_seed in sorted(runs.items()):
            for seed, curve in sorted(by_seed.items()):
                writer.writerows([code, variant, seed, r, f"{v:.4f}"] for r, v in sorted(curve.items()))


def _notes(notes: dict[str, str]) -> list[str]:
    return ["", *[f"- `{k}`: {v}" for k, v in notes.items()]] if notes else []


def table(
    root: Path,
    paper: dict[str, float],
    last: int,
    notes: dict[str, str],
    label_options: tuple[str, ...] = (),
    flags: str = "",
) -> str:
    """The table (and ``curves.csv``); ``flags``: the command's options, shown so it can be rerun."""
    runs = collect(root, label_options)
    lines = [
        f"Metric: mean test_before accuracy (%) of the last {last} rounds (FL-bench's statistic, the FedCMD paper's), "
        "per seed;",
        f"then the same at rounds {', '.join(map(str, CHECKPOINTS))} (10-round means ending there).",
        _generated(root, flags),
        "",
        *_head(CHECKPOINTS, paper=True),
    ]
    for (code, variant), by_seed in sorted(runs.items()):
        seeds = sorted(by_seed)
        finals = [last_mean(by_seed[s], last) for s in seeds]
        paper_value = paper.get(variant.split("_")[0].lower())  # fedcmd_detach_fix -> fedcmd
        points = [
            [statistics.fmean(by_seed[s][c - 10 : c]) for s in seeds if len(by_seed[s]) >= c] for c in CHECKPOINTS
        ]
        lines.append(_row(code, variant, seeds, finals, points, "" if paper_value is None else str(paper_value)))
    lines += _notes(notes)
    curves = {k: {seed: dict(enumerate(curve, 1)) for seed, curve in b.items()} for k, b in runs.items()}
    _write_curves(root, "test_before", curves)
    return "\n".join(lines) + "\n"


def paper_numbers(paper_file: dict, dataset: str, alpha: float) -> dict[str, float]:
    """method -> the paper's number for one dataset and alpha (a file with several ``tables``: the first
    that has them)."""
    for table_ in paper_file.get("tables", [paper_file]):
        numbers = (table_.get("results") or {}).get(dataset, {}).get(alpha)
        if numbers:
            return numbers
    raise SystemExit(f"the paper's results have no {dataset} alpha={alpha}")


def write_section(page: Path, name: str, text: str, marker: str = "side-by-side") -> None:
    """Replace the block ``<!-- MARKER:NAME -->`` ... ``<!-- /MARKER:NAME -->`` of ``page``."""
    start, end = f"<!-- {marker}:{name} -->", f"<!-- /{marker}:{name} -->"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if not pattern.search(page.read_text()):
        raise SystemExit(f"{page} has no {start} ... {end} block")
    page.write_text(pattern.sub(lambda _: f"{start}\n{text}{end}", page.read_text()))


def render(argv: list[str] | None = None) -> tuple[str, Path, str | None]:
    """The table a command line asks for: (text, run folder, page section); the table functions also
    write the folder's curves.csv."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--paper", default="fedcmd", help="conf/paper_results/<paper>.yaml")
    parser.add_argument("--dataset", default="fmnist")
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--last", type=int, default=10)
    parser.add_argument("--label-options", default="relay_phase2", help="comma-separated boolean method options")
    parser.add_argument("--section", help="also write the table into docs/authors-code.md's block of this name")
    parser.add_argument(
        "--metric",
        choices=("last", "final", "clusters"),
        default="last",
        help="last: the last rounds' mean test_before (FedCMD); final: the clients' final models (Felo/Velo); "
        "clusters: per cluster, then over clients and over clusters (FedCPMD's fedsper2.py)",
    )
    parser.add_argument("--paper-key", help="the paper's row for the table's paper column (default: --paper's method)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    notes_file = root / "variants.yaml"
    notes = yaml.safe_load(notes_file.read_text()) if notes_file.exists() else {}
    flags = "".join(
        f" --{name.replace('_', '-')} {shlex.quote(str(getattr(args, name)))}"
        for name in ("paper", "dataset", "alpha", "last", "metric", "paper_key")
        if getattr(args, name) != parser.get_default(name)
    )
    if args.metric == "clusters":
        results = yaml.safe_load((ROOT / "conf" / "paper_results" / f"{args.paper}.yaml").read_text())
        numbers = paper_numbers(results, args.dataset, args.alpha)
        text = cluster_table(root, args.dataset, numbers.get(args.paper_key or args.paper), args.last, notes, flags)
    elif args.metric == "final":  # no paper number: the Felo/Velo paper has no Fashion-MNIST results
        text = final_table(root, notes, flags)
    else:
        results = yaml.safe_load((ROOT / "conf" / "paper_results" / f"{args.paper}.yaml").read_text())
        paper = paper_numbers(results, args.dataset, args.alpha)
        text = table(root, paper, args.last, notes, tuple(o for o in args.label_options.split(",") if o), flags)
    return text, root, args.section


def main(argv: list[str] | None = None) -> None:
    text, root, section = render(argv)
    (root / "table.md").write_text(text)
    if section:
        write_section(ROOT / "docs" / "authors-code.md", section, text)
    print(text)


if __name__ == "__main__":
    main()
