"""Benchmark: what a deployment round costs beyond its training, per message.

A real SuperLink, its ServerApp SuperExec and N SuperNodes on loopback (TLS and node auth on:
the e2e tests' :class:`Cluster`, laid out from ``docker/topology.yaml``). Every SuperNode holds
the shared dataset and partitions it itself (node config ``client-id``, no ``data-dir``): the
case where a node used to re-read and re-partition the dataset in every message. Workload:
FedAvg, LeNet-5 on Fashion-MNIST (``experiment=fedcmd_fmnist``'s data and model), N clients,
all in every round, 1 local epoch.

Per round (median over rounds 2..R: round 1 also builds every node's cache) it reports the
round's wall time at the server and, per client message, what the ClientApp reported:

* ``cold start``: process start to the first message (Python, Flower, the FAB, torch);
* ``setup``: data (partition or cache), model, the client's saved state, the server's tensors;
* ``train`` and ``eval`` (``test_before`` + ``test_after``);
* ``fixed cost``: the round's wall time minus the clients' mean train + eval: everything a
  message costs that is not the client's work (process start, polling, transfers, set-up).

``torch import`` is ``python -c "import torch"`` on the same machine, the bound the fixed cost
is held to (issue 17: torch's import + 1 s). Run: ``python -m benchmarks.deployment``
(``--nodes 1 3``, ``--rounds``, ``--variant`` to compare settings).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, markdown_table, median, publish, run_header

DATA = ["dataset=fmnist", "alpha=1.0"]
RUN = {"method": "fedavg", "local_epochs": 1, "batch_size": 32}
# settings compared: what Flower does by default against what pflower sets (docs/deployment.md)
VARIANTS: dict[str, dict[str, Any]] = {
    "flower defaults": {
        "env": {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "1.0"},
        "node": {"cache-dir": "none", "torch-threads": os.cpu_count() or 1},
    },
    "pflower": {"env": {}, "node": {}},
    "pflower, torch-threads=1": {"env": {}, "node": {"torch-threads": 1}},
    # the SuperNode in --isolation process beside a pflower-superexec: ClientApps forked from a
    # process that imported torch once (client_app/forkserver.py)
    "pflower, warm ClientApps": {"env": {}, "node": {}, "isolation": "process"},
    # pflower's SuperNode launcher (client_app/supernode.py): Flower's SuperNode polling every
    # 0.25 s for 10 s after each message, every 3 s (Flower's) when idle
    "pflower, warm ClientApps, pflower-supernode": {
        "env": {},
        "node": {},
        "isolation": "process",
        "launcher": "pflower-supernode",
    },
    # the earlier measurement that led to pflower-supernode: Flower's loop patched to poll every 0.5 s
    # (one node only: the patched process is not named flower-supernode, so the thread share would
    # not count it)
    "warm ClientApps, node poll 0.5 s (patched Flower)": {
        "env": {},
        "node": {},
        "isolation": "process",
        "node_poll": 0.5,
    },
}
# flower-supernode with its idle poll capped (the variant above): Flower 1.41 sleeps 3 s in
# start_client_internal's loop when the SuperLink has no message for the node
PATCHED_SUPERNODE = (
    "import sys, time, types\n"
    "import flwr.supernode.start_client_internal as loop\n"
    "clock = types.SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if not n.startswith('_')})\n"
    "clock.sleep = lambda s: time.sleep(min(s, {poll}))\n"
    "loop.time = clock\n"
    "from flwr.supernode.cli.flower_supernode import flower_supernode\n"
    "flower_supernode()  # flower-supernode\n"
)


def _cluster_module() -> Any:
    path = REPO / "tests" / "e2e" / "e2e_cluster.py"
    spec = importlib.util.spec_from_file_location("pflower_e2e_cluster", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def torch_import_s(repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        times.append(time.perf_counter() - t0)
    return median(times)


def run_once(nodes: int, rounds: int, variant: str, tmp: Path) -> dict[str, Any]:
    """One deployment run; returns the per-round records and the run's wall time."""
    e2e = _cluster_module()
    settings = VARIANTS[variant]
    cluster = e2e.Cluster(
        tmp,
        nodes=nodes,
        node_config={i: {"cache-dir": str(tmp / f"cache-{i}"), **settings["node"]} for i in range(nodes)},
        isolation=settings.get("isolation"),
    )
    cluster.extra_env = dict(settings["env"])
    if "node_poll" in settings:
        if nodes != 1:
            raise SystemExit(f"variant {variant!r} runs with --nodes 1 only")
        flower_argv = cluster.node_argv
        cluster.node_argv = lambda i, **kw: [
            sys.executable,
            "-c",
            PATCHED_SUPERNODE.replace("{poll}", str(settings["node_poll"])),
            *flower_argv(i, **kw)[1:],
        ]
    if "launcher" in settings:  # the same flags, another command for the SuperNode
        node_argv = cluster.node_argv
        launcher = str(Path(sys.executable).parent / settings["launcher"])
        cluster.node_argv = lambda i, **kw: [launcher, *node_argv(i, **kw)[1:]]
    try:
        cluster.prepare(["dataset=digits"])  # certificates and data dirs; the run itself uses DATA
        cluster.up()
        config = cluster.topo.run_config(
            output_dir=cluster.place.output_dir,
            rounds=rounds,
            **{**RUN, "dataset": "fmnist"},
            overrides="alpha=1.0 final_eval=false round_timeout=300",
        )
        t0 = time.monotonic()
        run = cluster.flwr_run(config)
        e2e.wait_for(lambda: not run.alive(), 120 + 60 * rounds, "the run to finish", interval=0.5)
        wall = time.monotonic() - t0
        runs = sorted(Path(cluster.place.output_dir).glob("*/*-fedavg-fmnist"))
        lines = (runs[-1] / "metrics.jsonl").read_text().splitlines() if runs else []
        records = [json.loads(line) for line in lines]
        if len(records) != rounds:
            raise RuntimeError(f"{len(records)} of {rounds} rounds recorded; run log:\n{run.text()[-3000:]}")
        return {"records": records, "wall": wall}
    finally:
        cluster.close()


def row(nodes: int, variant: str, result: dict[str, Any], torch_s: float) -> dict[str, Any]:
    recs = result["records"][1:] or result["records"]

    def per_client(key: str) -> float | None:
        values = [r[key] / len(r["clients"]) for r in recs if key in r]
        return median(values) if values else None

    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    work = (per_client("client_train_s") or 0.0) + (per_client("client_eval_s") or 0.0)
    rnd = median(r["round_time_s"] for r in recs)
    fixed = rnd - work
    return {
        "nodes": nodes,
        "settings": variant,
        "round s": f"{rnd:.2f}",
        "cold start s": fmt(per_client("client_cold_start_s")),
        "setup s": fmt(per_client("client_setup_s")),
        "train s": fmt(per_client("client_train_s")),
        "eval s": fmt(per_client("client_eval_s")),
        "fixed cost s": f"{fixed:.2f}",
        "fixed - torch import s": f"{fixed - torch_s:+.2f}",
        "run wall s": f"{result['wall']:.0f}",
    }


COLUMNS = [
    "nodes",
    "settings",
    "round s",
    "cold start s",
    "setup s",
    "train s",
    "eval s",
    "fixed cost s",
    "fixed - torch import s",
    "run wall s",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--variant", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", default="benchmarks/results/deployment_round.md")
    args = parser.parse_args(argv)
    started = time.time()
    torch_s = torch_import_s()
    rows = []
    for nodes in args.nodes:
        for variant in args.variant:
            with tempfile.TemporaryDirectory(prefix="pflower-deploy-bench-") as tmp:
                result = run_once(nodes, args.rounds, variant, Path(tmp))
            rows.append(row(nodes, variant, result, torch_s))
            print(json.dumps(rows[-1]), flush=True)
    text = "\n\n".join(
        [
            "# A deployment round: fixed cost per message",
            run_header(
                "python -m benchmarks.deployment " + " ".join(argv if argv is not None else sys.argv[1:]), started
            ),
            f"torch import (median of 3): {torch_s:.2f} s. Medians over rounds 2..{args.rounds}; "
            "per-client columns are "
            "per message.",
            markdown_table(rows, COLUMNS),
        ]
    )
    publish(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
