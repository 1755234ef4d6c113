"""Pinned numbers: every method's short in-process run on offline data, and the numbers it wrote.

Each case is a few rounds of one method on scikit-learn's ``digits`` (six clients, three a
round, one local epoch), run on the in-process grid (``backend=serial``: one torch thread, client-id
order) with a fixed seed, under numerics that give the same bits on every x86-64 CPU
(``numerics.py``). :func:`fingerprint` keeps every number a run writes that does not
measure time: each round's accuracies, losses, bytes, clients, groups and method diagnostics,
and the final evaluation. ``pinned_numbers.json`` beside this file holds them; the test
``tests/unit/test_pinned_numbers.py`` re-runs each case and fails on the first number that moved.

A change that is meant to move a method's numbers regenerates the file in the same commit and
says why in its message::

    python -m tests.pinned.cases --update            # every method
    python -m tests.pinned.cases --update fedavg cfl # some
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import numerics

PINNED_FILE = Path(__file__).with_name("pinned_numbers.json")

# digits, 6 clients (3 a round), 3 rounds of 1 epoch: a few seconds a method. On the CPU also
# where a GPU is present: the pinned numbers are the CPU's (a GPU's kernels sum in other orders)
BASE = [
    "dataset=digits",
    "num_clients=6",
    "fraction=0.5",
    "rounds=3",
    "local_epochs=1",
    "alpha=0.5",
    "partition.min_size=20",
    "seed=7",
    "progress=false",
    "backend=serial",
    "device=cpu",
]
# three LeNet-5 depths with one feature width (Felo/Velo/FedHe share class features)
HETERO = [
    "model=mixed",
    "~model.archs",
    "+model.archs={l2: {name: lenet5, fc_layers: 2, feature_dim: 32}, l3: {name: lenet5, fc_layers: 3, feature_dim: "
    "32},"
    " l4: {name: lenet5, fc_layers: 4, feature_dim: 32}}",
    "optimizer=adam",
    "lr=0.003",
    "local_steps=6",
    "fraction=1.0",
]

# method -> its overrides: options that make its mechanism act within 3 rounds
CASES: dict[str, list[str]] = {
    "local": [],
    "fedavg": [],
    "fedavg_mixed": ["method=fedavg", "model=mixed"],
    "fedprox": [],
    "fedper": [],
    "fedrep": [],
    "fedbabu": ["method.finetune_epochs=1"],
    "fedbn": [],
    "lgfedavg": [],
    "ditto": [],
    "fedrod": [],
    "apfl": [],
    "perfedavg": [],
    "perfedavg_hf": ["method=perfedavg", "method.version=hf"],
    "pfedme": ["method.beta=2.0"],
    "fedala": [],
    "fedpac": [],
    "fedas": [],
    "moon": [],
    "feddyn": [],
    "fedamp": [],
    "fedfomo": ["method.m=2"],
    "fedap": ["method.warmup=1"],
    "pfedla": [],
    "pfedsim": ["method.warmup=1"],
    "cfl": ["method.start_round=1", "method.eps1=100", "method.eps2=0", "fraction=1.0"],
    "fedcmd": ["method.kp=2"],
    "fedcpmd": ["method.kp=1", "fraction=1.0"],
    "fedtsdp": ["dataset.public=holdout", "fraction=1.0", "method.h_th=0.0", "method.eps1=0.005", "method.eps2=inf"],
    "kapc": ["model=cnn_kapc"],
    "kapc_bls": ["model=cnn_kapc"],
    "felo": [*HETERO, "method.warmup=0.34"],
    "velo": [
        *HETERO,
        "method.warmup=0.34",
        "method.cvae_hidden=32",
        "method.cvae_latent=8",
        "method.cvae_label_dim=8",
        "method.cvae_epochs=2",
    ],
    "fedhe": [*HETERO, "method.warmup=0.34"],
    "fedproto": [*HETERO],
    "heterofl": ["model=lenet5_widths", "fraction=1.0"],  # widths 1/4, 1/2, 1 on two clients each
    "fedgkt": [*HETERO, "method.hidden=[32]", "method.server_epochs=2"],
    "fedmd": [*HETERO, "dataset.transfer_fraction=0.2", "method.subset=50", "method.transfer_epochs=1"],
    "heterofl_dynamic": ["method=heterofl", "model=lenet5_widths", "method.assignment=dynamic"],
}


def method_of(case: str) -> str:
    """The method a case runs (``fedavg_mixed`` runs fedavg)."""
    explicit = [o.split("=", 1)[1] for o in CASES[case] if o.startswith("method=")]
    return explicit[-1] if explicit else case


def overrides(case: str) -> list[str]:
    return [*BASE, f"method={method_of(case)}", *CASES[case]]


# measured, not computed: durations, their shares, where the run was written
# not numbers of the method: a time share, paths, and where the data came from (data_sha256 hashes
# the reader's output, which a library release may change bit-wise; tests/unit/test_data_sources.py
# checks the fingerprint itself)
UNPINNED = ("client_eval_share", "run_dir", "artifacts", "data_dir", "data_sha256")


def _is_time(key: str) -> bool:
    return "time" in key or key.endswith("_s") or key in UNPINNED


def fingerprint(rounds: list[dict[str, Any]], summary: dict[str, Any]) -> dict[str, Any]:
    """Everything a run wrote that is not a duration or a path: per-round records and the summary."""

    def keep(record: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in sorted(record.items()) if not _is_time(k)}

    return {"rounds": [keep(r) for r in rounds], "summary": keep(summary)}


def run_case(case: str, grid: Callable[[int], Any] | None = None, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run one case in this process (in a throw-away output directory) and return its fingerprint.

    ``grid``: builds the grid from the number of clients (default: the serial engine's);
    ``extra``: overrides after the case's own (settings that must not move a number)."""
    import torch

    from pflower.server_app.results import read_metrics
    from pflower.server_app.run_plan import plan_run
    from pflower.server_app.runner import check_strategy, run_experiment
    from pflower.simulation.inprocess import InProcessGrid

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as out:
        plan = plan_run([*overrides(case), *extra, f"output_dir={out}"])
        check_strategy(plan)
        made = (grid or (lambda n: InProcessGrid(n, record=False, client_threads=1)))(plan.run.num_clients)
        try:
            summary = run_experiment(made, plan)
        finally:
            made.close()
        rounds = read_metrics(summary["run_dir"])
        return json.loads(json.dumps(fingerprint(rounds, summary), sort_keys=True))


def first_difference(expected: Any, actual: Any, path: str = "", rel: float = 1e-9) -> str | None:
    """The first place where two fingerprints differ (None: equal), e.g.
    ``rounds[2].test_before_acc: 0.8125 -> 0.8101``. Floats are equal within ``rel`` (the last
    bits a different CPU's kernels may change); everything else exactly."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual)):
            if key not in actual:
                return f"{path}{key}: missing now (was {expected[key]!r})"
            if key not in expected:
                return f"{path}{key}: new (now {actual[key]!r})"
            found = first_difference(expected[key], actual[key], f"{path}{key}.", rel)
            if found:
                return found
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return f"{path.rstrip('.')}: {len(expected)} entries -> {len(actual)}"
        for i, (a, b) in enumerate(zip(expected, actual)):
            found = first_difference(a, b, f"{path.rstrip('.')}[{i}].", rel)
            if found:
                return found
        return None
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (expected, actual))
    if numbers and (isinstance(expected, float) or isinstance(actual, float)):
        if math.isclose(expected, actual, rel_tol=rel, abs_tol=1e-12) or (math.isnan(expected) and math.isnan(actual)):
            return None
    elif expected == actual:
        return None
    return f"{path.rstrip('.')}: {expected!r} -> {actual!r}"


def load_pinned() -> dict[str, Any]:
    return json.loads(PINNED_FILE.read_text()) if PINNED_FILE.exists() else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help=f"cases to run (default: all): {', '.join(CASES)}")
    parser.add_argument("--update", action="store_true", help=f"write the numbers into {PINNED_FILE.name}")
    args = parser.parse_args(argv)
    numerics.apply()  # before run_case imports torch: the same numerics as the tests
    numerics.disable_mkldnn()
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; cases: {', '.join(CASES)}")
    pinned = load_pinned()
    moved = 0
    for case in args.cases or list(CASES):
        got = run_case(case)
        diff = first_difference(pinned[case], got) if case in pinned else "not pinned yet"
        print(f"{case:<14} {'same' if diff is None else diff}")
        moved += diff is not None
        pinned[case] = got
    if args.update:
        PINNED_FILE.write_text(
            json.dumps({k: pinned[k] for k in CASES if k in pinned}, indent=1, sort_keys=True) + "\n"
        )
        print(f"wrote {PINNED_FILE}")
    return 0 if args.update or not moved else 1


if __name__ == "__main__":
    sys.exit(main())
