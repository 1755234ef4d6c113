"""KAPC's relationship cube on a federation with a known structure: does it move, and where to?

Eight clients learn the same digits images; clients 0-3 with labels y, clients 4-7 with 9 - y
(two groups whose layers should be shared inside a group and not across). Each run is KAPC
(or KAPC+BLS) with one cube option changed, 12 rounds, every client every round; the table
gives how far the cube moved (mean |dR| a round), the mean self-weight R[i, l, i] per layer,
the weight a row puts on its own group's other clients against the other group's, the layers
the BLS downlink left out, and the paper's metric (best round's unweighted mean accuracy of
the trained models)::

    python -m benchmarks.kapc_cube --out benchmarks/results/kapc_cube.md

A proxy for the FMNIST runs (seconds, not hours a run), not a substitute for them.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import markdown_table, publish, run_header

GROUP = 4  # clients 0..3 see labels y, clients 4..7 see 9 - y
CLIENTS = 2 * GROUP
SETUP = [
    "model=cnn_kapc",
    "dataset=local",
    f"num_clients={CLIENTS}",
    "fraction=1.0",
    "rounds=12",
    "local_epochs=4",
    "batch_size=16",
    "lr=0.05",
    "progress=false",
]

# (label, overrides): the sweep over what the paper leaves open
VARIANTS: list[tuple[str, list[str]]] = [
    ("kapc, cube_lr=centered (default)", ["method=kapc"]),
    *[(f"kapc, cube_lr={lr}", ["method=kapc", f"method.cube_lr={lr}"]) for lr in ("0.01", "0.1", "1", "10", "100")],
    ("kapc, cube_lr=theory (raw Gram)", ["method=kapc", "method.cube_lr=theory"]),
    ("kapc, centered, cube_steps=5", ["method=kapc", "method.cube_steps=5"]),
    ("kapc, centered, cube_init=uniform", ["method=kapc", "method.cube_init=uniform"]),
    ("kapc_bls (defaults)", ["method=kapc_bls"]),
    ("kapc_bls, cube_lr=0.01 (before the fix)", ["method=kapc_bls", "method.cube_lr=0.01"]),
    ("local", ["method=local"]),
    ("fedavg", ["method=fedavg"]),
]


def write_two_group_federation(root: Path) -> list[Path]:
    """Eight node directories (dataset=local): 48 training and 16 test digits each, the same
    images for everyone, labels y for clients 0-3 and 9 - y for clients 4-7."""
    from pflower.federated_data import DataSpec, load_client_data
    from pflower.federated_data.local import write_local_dir

    data = load_client_data(
        DataSpec(dataset="digits", partitioner="iid", num_clients=1, test_fraction=0.2, min_size=10), 0
    )
    x = data.x_train.numpy()
    unit = ((x - x.min()) / (x.max() - x.min())).astype(np.float32)
    y = data.y_train.numpy()
    rng = np.random.default_rng(0)
    paths = []
    for cid in range(CLIENTS):
        idx = rng.permutation(len(y))[:64]
        labels = y[idx] if cid < GROUP else 9 - y[idx]
        paths.append(
            write_local_dir(
                root / f"c{cid}",
                (unit[idx[:48]], labels[:48]),
                (unit[idx[48:]], labels[48:]),
                name="digits",
                num_classes=10,
            )
        )
    return paths


def two_group_grid(root: Path, **kwargs: Any) -> Any:
    """An in-process grid whose node i reads ``root/c<i>`` (after :func:`write_two_group_federation`)."""
    from pflower.simulation.inprocess import InProcessGrid

    grid = InProcessGrid(CLIENTS, **kwargs)
    for cid in range(CLIENTS):
        grid.contexts[grid.node_of_client[cid]].node_config["data-dir"] = str(root / f"c{cid}")
    return grid


def within_between(cube: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per layer: the mean weight a row gives the other clients of its own group, and the other group's."""
    same = np.array([[(i < GROUP) == (j < GROUP) and i != j for j in range(CLIENTS)] for i in range(CLIENTS)])
    cross = ~same & ~np.eye(CLIENTS, dtype=bool)
    return (
        np.array([cube[:, l, :][same].mean() for l in range(cube.shape[1])]),
        np.array([cube[:, l, :][cross].mean() for l in range(cube.shape[1])]),
    )


def run_variant(overrides: list[str], root: Path, out: Path) -> dict[str, Any]:
    import torch

    from pflower.server_app.results import read_metrics
    from pflower.server_app.run_plan import plan_run
    from pflower.server_app.runner import run_experiment

    torch.set_num_threads(1)
    plan = plan_run([*SETUP, f"output_dir={out}", *overrides])
    t0 = time.perf_counter()
    summary = run_experiment(two_group_grid(root, record=False, client_threads=1), plan, check_partition=False)
    rounds = read_metrics(summary["run_dir"])
    row: dict[str, Any] = {
        "best mean acc": f"{100 * summary['best_mean_acc']:.1f}",
        "MiB down": f"{summary['total_mib_down']:.0f}",
        "s": f"{time.perf_counter() - t0:.0f}",
    }
    cube_file = Path(summary["run_dir"]) / "cube.npy"
    if cube_file.exists():
        cube = np.load(cube_file)
        within, between = within_between(cube)
        selfw = np.einsum("ili->l", cube) / cube.shape[0]
        row.update(
            {
                "mean abs dR / round": f"{np.mean([r['cube_delta'] for r in rounds]):.4f}",
                "self-weight by layer": " ".join(f"{v:.2f}" for v in selfw),
                "own group / other group by layer": " ".join(f"{w:.3f}/{b:.3f}" for w, b in zip(within, between)),
                "layers not sent": str(summary.get("masked_layers", "")),
            }
        )
    return row


def shown_path(path: str) -> str:
    """``path`` as the header shows it: relative to the checkout when it is inside it (no machine's paths in a
    result)."""
    from .common import REPO

    try:
        return str(Path(path).resolve().relative_to(REPO.resolve()))
    except ValueError:
        return Path(path).name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the report here (e.g. benchmarks/results/kapc_cube.md)")
    parser.add_argument("--only", nargs="*", help="variant labels to run (default: all)")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_two_group_federation(root / "data")
        for label, overrides in VARIANTS:
            if args.only and label not in args.only:
                continue
            rows.append({"variant": label, **run_variant(overrides, root / "data", root / "out")})
            print(rows[-1], flush=True)
    columns = [
        "variant",
        "best mean acc",
        "mean abs dR / round",
        "self-weight by layer",
        "own group / other group by layer",
        "layers not sent",
        "MiB down",
        "s",
    ]
    text = "\n\n".join(
        [
            "# KAPC's cube on a two-group federation",
            run_header("python -m benchmarks.kapc_cube" + (f" --out {shown_path(args.out)}" if args.out else "")),
            __doc__.split("\n\n")[1].replace("\n", " ").removesuffix("::") + ".",
            "Layers (cnn_kapc): conv1, conv2, fc1, fc2, classifier. Set-up: "
            + " ".join(SETUP)
            + "; everything else at its default.",
            markdown_table(rows, columns),
        ]
    )
    publish(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
