"""Velo's server CVAE: the time of one training step, the cost that keeps the authors' own CVAE
schedule off a 15-minute GPU loan, so Velo's side by side runs a shorter one (docs/authors-code.md,
"Felo and Velo").

pflower's ``train_cvae`` (models/cvae.py, the Felo/Velo paper's sizes: 1,024-wide features, label
embedding 512, hidden 1,024, latent 512, batches of 50, the code's loss) over one epoch of
``--features`` random features, twice; and the authors' way of batching the stored features (a
``DataLoader`` over a ``TensorDataset``) against slicing one permutation, without training::

    python -m benchmarks.cvae_step --out benchmarks/results/cvae_step.md   # on a GPU when present

A 200-iteration Velo run trains its CVAE about 95 times, each 10 epochs over up to 50,000 features.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from pflower.models.cvae import CVAE, train_cvae

from .common import markdown_table, publish, run_header

BATCH = 50


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def cvae_epoch_seconds(features: torch.Tensor, labels: torch.Tensor, device: torch.device) -> float:
    """One epoch of train_cvae over ``features`` after a short warm-up, in seconds."""
    torch.manual_seed(0)
    model = CVAE(features.shape[1], 10).to(device)
    warm = min(2_000, len(labels))
    train_cvae(model, features[:warm], labels[:warm], torch.Generator().manual_seed(0), epochs=1, kind="code")
    _sync(device)
    start = time.perf_counter()
    train_cvae(model, features, labels, torch.Generator().manual_seed(1), epochs=1, kind="code")
    _sync(device)
    return time.perf_counter() - start


def sliced_batches(x: torch.Tensor, y: torch.Tensor):  # noqa: ANN201 - a generator of (x, y) batches
    order = torch.randperm(len(y), device=y.device)
    for i in range(0, len(order), BATCH):
        yield x[order[i : i + BATCH]], y[order[i : i + BATCH]]


def loader_seconds(batches, device: torch.device) -> tuple[int, float]:  # noqa: ANN001
    _sync(device)
    start, count = time.perf_counter(), 0
    for _ in batches:
        count += 1
    _sync(device)
    return count, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--features", type=int, default=50_000, help="stored features (the FIFO's full size)")
    parser.add_argument("--out", help="also write the report here (e.g. benchmarks/results/cvae_step.md)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    started = time.time()
    feats = torch.randn(args.features, 1024, device=device)
    labels = torch.randint(0, 10, (args.features,), device=device)
    steps = -(-args.features // BATCH)
    rows = []
    for repeat in (1, 2):
        seconds = cvae_epoch_seconds(feats, labels, device)
        rows.append(
            {
                "what": f"train_cvae, one epoch (repeat {repeat})",
                "batches": steps,
                "s": f"{seconds:.2f}",
                "ms a batch": f"{1000 * seconds / steps:.3f}",
            }
        )
    for label, batches in (
        (
            "authors' DataLoader(TensorDataset), batches only",
            DataLoader(TensorDataset(feats, labels), BATCH, shuffle=True),
        ),
        ("one permutation, sliced, batches only", sliced_batches(feats, labels)),
    ):
        count, seconds = loader_seconds(batches, device)
        rows.append(
            {"what": label, "batches": count, "s": f"{seconds:.2f}", "ms a batch": f"{1000 * seconds / count:.3f}"}
        )
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    text = "\n\n".join(
        [
            "# Velo's CVAE: one training step",
            run_header(
                "python -m benchmarks.cvae_step " + " ".join(argv if argv is not None else sys.argv[1:]), started
            ),
            f"Device: {name}, torch {torch.__version__}; {args.features:,} random 1,024-wide features, batches of "
            f"{BATCH}; the CVAE at the paper's sizes, the code's loss.",
            markdown_table(rows, ["what", "batches", "s", "ms a batch"]),
        ]
    )
    publish(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
