"""CFL's split on a federation with known label groups: does it split, when, and into which groups?

Twelve clients learn scikit-learn's digits with two classes each: clients 0-3 hold classes
{0, 1}, clients 4-7 {2, 3}, clients 8-11 {4, 5} (a 2-classes-per-client split whose label
groups are known). Every client trains every round. The rule that sets eps2 is the paper's
meaning of it: above what clients that share one distribution still move at the stationary
point, below what incongruent ones move. So first the same twelve clients run with every
client holding all six classes (one distribution; no split allowed), the largest update norm
from ``start_round`` on is logged, and eps2 = ``MARGIN`` x that; then the label-group
federation runs with that eps2, and the clusters it ends with are scored by the adjusted Rand
index (ARI) against the label groups. The reference code's eps2 = 1.6 is run too::

    python -m benchmarks.cfl_split --out benchmarks/results/cfl_split.md

A proxy for the FMNIST runs (seconds a run), not a substitute for them.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .common import markdown_table, publish, run_header

PAIRS = ((0, 1), (2, 3), (4, 5))
PER_GROUP = 4
CLIENTS = len(PAIRS) * PER_GROUP
MARGIN = 1.25  # eps2 = MARGIN x the largest update of the one-distribution federation
SETUP = [
    "dataset=local",
    f"num_clients={CLIENTS}",
    "fraction=1.0",
    "rounds=15",
    "local_epochs=2",
    "batch_size=16",
    "lr=0.05",
    "progress=false",
    "method=cfl",
    "method.start_round=5",
]


def write_label_group_federation(root: Path, groups: bool = True) -> list[int]:
    """Node directories ``root/c<i>`` (dataset=local) of digits: 60 training and 20 test images a
    client, from its group's two classes (``groups``) or from all six (one distribution).
    Returns each client's label group."""
    from pflower.federated_data import DataSpec, load_client_data
    from pflower.federated_data.local import write_local_dir

    data = load_client_data(
        DataSpec(dataset="digits", partitioner="iid", num_clients=1, test_fraction=0.2, min_size=10), 0
    )
    x, y = data.x_train.numpy(), data.y_train.numpy()
    unit = ((x - x.min()) / (x.max() - x.min())).astype(np.float32)
    rng = np.random.default_rng(0)
    labels = []
    for cid in range(CLIENTS):
        group = cid // PER_GROUP
        classes = PAIRS[group] if groups else tuple(c for pair in PAIRS for c in pair)
        pool = np.flatnonzero(np.isin(y, classes))
        idx = rng.choice(pool, size=80, replace=False)
        write_local_dir(
            root / f"c{cid}",
            (unit[idx[:60]], y[idx[:60]]),
            (unit[idx[60:]], y[idx[60:]]),
            name="digits",
            num_classes=10,
        )
        labels.append(group)
    return labels


def grid_of(root: Path, **kwargs: Any) -> Any:
    """An in-process grid whose node i reads ``root/c<i>``."""
    from pflower.simulation.inprocess import InProcessGrid

    grid = InProcessGrid(CLIENTS, **kwargs)
    for cid in range(CLIENTS):
        grid.contexts[grid.node_of_client[cid]].node_config["data-dir"] = str(root / f"c{cid}")
    return grid


def cluster_labels(clusters: Sequence[Sequence[int]], n: int) -> list[int]:
    """Each client's cluster index (a labelling to score with the ARI)."""
    out = [-1] * n
    for c, members in enumerate(clusters):
        for m in members:
            out[m] = c
    return out


def run_cfl(root: Path, out: Path, overrides: Sequence[str] = ()) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One CFL run on the federation under ``root``: its summary and its rounds."""
    import torch

    from pflower.server_app.results import read_metrics
    from pflower.server_app.run_plan import plan_run
    from pflower.server_app.runner import run_experiment

    torch.set_num_threads(1)
    plan = plan_run([*SETUP, f"output_dir={out}", *overrides])
    summary = run_experiment(grid_of(root, record=False, client_threads=1), plan, check_partition=False)
    return summary, read_metrics(summary["run_dir"])


def calibrated_eps2(rounds: Sequence[dict[str, Any]], start_round: int, margin: float = MARGIN) -> float:
    """eps2 above every update of a one-distribution federation from ``start_round`` on."""
    norms = [r["max_update_norm"] for r in rounds if r["round"] >= start_round and "max_update_norm" in r]
    if not norms:
        raise ValueError(f"no round from {start_round} on logged max_update_norm")
    return margin * max(norms)


def main(argv: list[str] | None = None) -> int:
    from sklearn.metrics import adjusted_rand_score

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the report here (e.g. benchmarks/results/cfl_split.md)")
    args = parser.parse_args(argv)
    started = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        truth = write_label_group_federation(tmp_path / "groups")
        write_label_group_federation(tmp_path / "one", groups=False)
        _, one = run_cfl(tmp_path / "one", tmp_path / "out", ["method.start_round=1000"])
        eps2 = calibrated_eps2(one, start_round=5)
        variants = [
            ("one distribution, eps2 calibrated", tmp_path / "one", [f"method.eps2={eps2}"], None),
            ("label groups, eps2 calibrated", tmp_path / "groups", [f"method.eps2={eps2}"], truth),
            ("label groups, eps2 = 1.6 (reference code)", tmp_path / "groups", [], truth),
        ]
        for label, root, overrides, labels in variants:
            summary, rounds = run_cfl(root, tmp_path / "out", overrides)
            ari = adjusted_rand_score(labels, cluster_labels(summary["clusters"], CLIENTS)) if labels else None
            norms = [r["max_update_norm"] for r in rounds if r["round"] >= 5]
            rows.append(
                {
                    "variant": label,
                    "eps2": f"{float(overrides[0].split('=')[1]) if overrides else 1.6:.3f}",
                    "max update norm, rounds 5-15": f"{min(norms):.3f}-{max(norms):.3f}",
                    "split rounds": ", ".join(map(str, summary["split_rounds"])) or "none",
                    "clusters": str(summary["clusters"]),
                    "ARI vs label groups": "" if ari is None else f"{ari:.2f}",
                    "best mean acc": f"{100 * summary['best_mean_acc']:.1f}",
                }
            )
            print(rows[-1], flush=True)
    columns = list(rows[0])
    text = "\n".join(
        [
            "# CFL's split on a federation with known label groups",
            "",
            run_header("python -m benchmarks.cfl_split", started),
            "",
            f"12 digits clients, 2 classes each ({PAIRS}, 4 clients a pair), all every round, 15 rounds of "
            f"2 epochs, splits allowed from round 5. eps2 = {MARGIN} x the largest update norm (rounds 5-15) of "
            "the same clients holding all six classes; eps1 = 0.4 (the reference code's) throughout.",
            "",
            markdown_table(rows, columns),
            "",
        ]
    )
    publish(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
