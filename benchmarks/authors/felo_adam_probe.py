"""Row 2 of the Felo/Velo side by side on its own: a fresh Adam each round, or one kept across rounds.

    python -m benchmarks.authors.felo_adam_probe --out docs/results/authors_felo/adam_probe.md

In the side by side (docs/authors-code.md, "Felo and Velo") pflower's clients are 2-3 points
below the authors' code mid-run and level at the end, for Felo and Velo alike. One of the
differences the two share is the optimiser's state (row 2): the authors' clients are persistent
objects with one Adam each, whose moments and step count run on from one round to the next;
pflower's clients build a fresh Adam every round (its first steps, bias-corrected, move every
weight by about the learning rate). This probe isolates that difference. One client's model, on
its own data, trains the sessions it would train in the 200-round run (2 of 10 clients a round:
40 sessions of 10 Adam steps of 50, learning rate 1e-3, x0.1 from session 21, as the run's schedule
falls at half the rounds), cross-entropy only, once with a fresh Adam every session and once with
one Adam kept; everything else is the same (initial weights, batches: pflower's
``batch_indices`` from one generator). After each session the model is scored on the client's
test tenth. Clients 0 (two conv layers) and 5 (three), the code's split, ``--seeds`` seeds.

The probe leaves out the class knowledge (the server's) and the other clients: it shows whether
the optimiser's state alone moves accuracy by the size of the mid-run gap, not that it is all of it.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pflower.client_app.training import TrainArgs, evaluate, train
from pflower.federated_data.sources import DATASETS, read_fmnist
from pflower.federated_data.tensors import normalize
from pflower.models import build_model
from pflower.models.optim import PlainAdam

SESSIONS = 40  # 200 rounds x 2 of 10 clients
DROP = 20  # the learning rate falls x0.1 from this session on (half the rounds)
STEPS, BATCH, LR = 10, 50, 1e-3
CLIENTS = {0: (64, 256), 5: (64, 128, 256)}  # the code's --old_CNN widths: clients 0-4, 5-9
#: sessions shown, with the round of the run they stand for (a client trains in 1 round of 5)
SHOWN = {4: 21, 12: 61, 20: 101, 28: 141, 40: 200}


def load_fmnist(data_dir: Path | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fashion-MNIST as pflower reads and normalises it (``federated_data.sources``)."""
    info = DATASETS["fmnist"]
    splits = read_fmnist(None if data_dir is None else str(data_dir))
    mean, std = np.array(info.mean, np.float32), np.array(info.std, np.float32)
    (x_train, y_train), (x_test, y_test) = splits["train"], splits["test"]
    return (
        normalize(x_train, mean, std),
        torch.from_numpy(y_train),
        normalize(x_test, mean, std),
        torch.from_numpy(y_test),
    )


def sessions(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    keep: bool,
    seed: int,
) -> list[float]:
    """Test accuracy (%) after each of :data:`SESSIONS` sessions of :data:`STEPS` Adam steps, each
    pflower's client training (``train``); ``keep``: one Adam for all of them (the authors' code),
    else a fresh one each (pflower)."""
    generator = torch.Generator().manual_seed(seed)  # the batches
    torch.manual_seed(seed)  # the dropout masks
    kept = PlainAdam(model.parameters(), lr=LR) if keep else None
    accuracy = []
    for s in range(SESSIONS):
        lr = LR if s < DROP else LR * 0.1
        if kept is not None:
            kept.lr = lr
        args = TrainArgs(batch_size=BATCH, steps=STEPS, optimizer="adam", lr=lr)
        train(model, x, y, args, generator=generator, optimizer=kept)
        correct, _, n = evaluate(model, x_test, y_test)
        accuracy.append(100.0 * correct / n)
    return accuracy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="Fashion-MNIST's folder (default: where pflower looks)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = load_fmnist(args.data)
    curves: dict[tuple[str, int, int], list[float]] = {}
    started = time.perf_counter()
    for seed in args.seeds:
        for client, channels in CLIENTS.items():
            # the code's split: client i trains on the i-th tenth of the training set, tests on the i-th tenth
            x, y = x_train[client * 6000 : (client + 1) * 6000], y_train[client * 6000 : (client + 1) * 6000]
            xt, yt = x_test[client * 1000 : (client + 1) * 1000], y_test[client * 1000 : (client + 1) * 1000]
            for variant, keep in (("fresh Adam each round (pflower)", False), ("one Adam kept (authors)", True)):
                model = build_model("cnn_felo", (1, 28, 28), 10, seed=seed, channels=channels)
                curves[(variant, client, seed)] = sessions(model, x, y, xt, yt, keep, seed)
                print(f"seed {seed} client {client} {variant}: {curves[(variant, client, seed)][-1]:.2f}", flush=True)
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# Felo/Velo side by side, row 2 alone: a fresh Adam each round or one kept",
        "",
        f"Command: `python -m benchmarks.authors.felo_adam_probe{' --out ' + str(args.out) if args.out else ''}`  ",
        f"Commit: {commit}; torch {torch.__version__}, one CPU thread; {time.perf_counter() - started:.0f} s.",
        "",
        f"One client's model on its own tenth of Fashion-MNIST (the code's split), {SESSIONS} sessions of "
        f"{STEPS} Adam steps of {BATCH} (lr {LR:g}, x0.1 from session {DROP + 1}), cross-entropy only; test "
        "accuracy (%) on the client's test tenth after the session, mean over clients 0 and 5 (two and three "
        f"conv layers) and seeds {', '.join(map(str, args.seeds))}. Session s stands for round 5s of the "
        "200-round run (a client trains in 1 round of 5).",
        "",
        "| optimiser | " + " | ".join(f"session {s} (r{r})" for s, r in SHOWN.items()) + " |",
        "|---|" + "---|" * len(SHOWN),
    ]
    for variant in ("fresh Adam each round (pflower)", "one Adam kept (authors)"):
        runs = [c for k, c in curves.items() if k[0] == variant]
        lines.append(
            f"| {variant} | " + " | ".join(f"{statistics.fmean(c[s - 1] for c in runs):.2f}" for s in SHOWN) + " |"
        )
    lines += ["", "Per client and seed, the same sessions:", ""]
    lines += [
        "| optimiser | client | seed | " + " | ".join(f"s{s}" for s in SHOWN) + " |",
        "|---|---|---|" + "---|" * len(SHOWN),
    ]
    for (variant, client, seed), c in sorted(curves.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        lines.append(f"| {variant} | {client} | {seed} | " + " | ".join(f"{c[s - 1]:.2f}" for s in SHOWN) + " |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)


if __name__ == "__main__":
    sys.exit(main())
