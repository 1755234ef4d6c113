"""What the deployment tests share (test_deployment*.py, one file per cluster so that each
cluster is its own xdist work unit, tests/conftest.py): the run's settings and the waits."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from e2e_cluster import Cluster, Proc, train_messages_received, wait_for

ROUND_TIMEOUT = 45  # s; a SIGKILLed SuperNode is declared offline by the SuperLink after 2 heartbeat intervals (20 s)
RUN_DEADLINE = 420  # s for one deployment's `flwr run`
DATA = ["dataset=digits", "alpha=1.0", "partition.min_size=20"]
KP = 1  # phase 1 (layer vote) is round 1; from round 2 on l* stays on the clients
# Local training is a fraction of a second here (a few hundred digits); what costs is starting a
# ClientApp process per message (~4 s of CPU). So a few more local steps than the demo's cost
# nothing and let the personalized models move clearly away from the untrained level.
TRAIN = {"local_epochs": 3, "batch_size": 16}


def run_config(
    cluster: Cluster, rounds: int, overrides: str = f"method.kp={KP}", timeout: int = ROUND_TIMEOUT, **extra: object
) -> str:
    return cluster.topo.run_config(
        output_dir=cluster.place.output_dir,
        rounds=rounds,
        **{**TRAIN, **extra},
        overrides=f"{overrides} round_timeout={timeout}",
    )


def restart_until_active(cluster: Cluster, i: int, deadline: float) -> tuple[float, int]:
    """Restart SuperNode i the way a supervisor would (compose `restart: unless-stopped`).

    With node authentication the SuperLink refuses to activate a node id that it still
    believes online, so a node that was killed (not shut down) is refused ("Failed to activate
    SuperNode", exit 305) until its missed heartbeats mark it offline. Returns the time of the
    successful start and how many starts were refused.
    """
    refused = 0
    while time.monotonic() < deadline:
        started = time.monotonic()
        proc = cluster.start_node(i)
        try:
            wait_for(lambda: "SuperNode ID:" in proc.text() or not proc.alive(), 60, f"supernode-{i} to start")
        except TimeoutError:
            return started, refused
        if proc.alive():
            return started, refused
        assert "Failed to activate SuperNode" in proc.text(), proc.text()[-2000:]
        refused += 1
        time.sleep(2)
    raise TimeoutError(f"supernode-{i} could not rejoin")


def run_until_node_has_round(cluster: Cluster, rounds: int, node: int, rnd: int) -> tuple[Proc, float, float]:
    """Start `flwr run` and return once SuperNode ``node`` has received its round-``rnd`` train message.

    Returns the run, its start time and its deadline; the run must still be going.
    """
    t_run = time.monotonic()
    run = cluster.flwr_run(run_config(cluster, rounds))
    proc = cluster.procs[f"supernode-{node}"]
    wait_for(
        lambda: train_messages_received(proc.text()) >= rnd or not run.alive(),
        RUN_DEADLINE,
        f"round {rnd} at node {node}",
    )
    assert run.alive(), run.text()[-4000:]
    return run, t_run, t_run + RUN_DEADLINE


def finish(cluster: Cluster, run, deadline: float) -> None:
    wait_for(lambda: not run.alive(), max(1.0, deadline - time.monotonic()), "flwr run to finish", interval=1)


def write_timings(cluster: Cluster, timings: dict) -> None:
    print("\n[e2e timings]", json.dumps(timings, indent=1))
    (cluster.tmp / "timings.json").write_text(json.dumps(timings, indent=1))


# ----------------------------------------------------------------------------- the methods clusters
# test_deployment_methods.py and test_deployment_peers.py: one method after another on warm ClientApps

METHOD_NODES = 2
IMAGE_NODE = 1  # this node's data directory holds image folders (train/<class>/, test/<class>/), not npz


def as_image_folders(node_dir: Path) -> None:
    """Rewrite a node's exported directory in torchvision's ImageFolder layout (meta.json kept,
    naming the class order and the pooled normalization), as a device holding images would."""
    from pflower.federated_data.datasets import write_image_folder

    meta = json.loads((node_dir / "meta.json").read_text())
    classes = [f"class{k}" for k in range(int(meta["num_classes"]))]
    for split in ("train", "test"):
        with np.load(node_dir / f"{split}.npz") as z:
            write_image_folder(node_dir / split, z["images"], z["labels"], classes)
        (node_dir / f"{split}.npz").unlink()
    (node_dir / "meta.json").write_text(json.dumps({**meta, "classes": classes}))


METHOD_ROUND_TIMEOUT = 150  # s: no node is killed here, so no reason to cut a slow (shared-CPU) round short


def method_cluster(tmp: Path, image_node: int | None = IMAGE_NODE) -> Cluster:
    """2 SuperNodes over loopback, TLS and node auth, in ``--isolation process`` beside one
    ``pflower-superexec`` serving both (``clientapp-0``, a task loop per node): every message's
    ClientApp is forked from a process that imported torch once (the other deployments here use
    Flower's default, a fresh process per message); ``image_node``'s data as image folders."""
    cluster = Cluster(
        tmp,
        nodes=METHOD_NODES,
        # num-partitions: what the example app's data function reads on a SuperNode
        node_config={i: {"cache-dir": str(tmp / "cache"), "num-partitions": METHOD_NODES} for i in range(METHOD_NODES)},
        isolation="process",
        shared_superexec=True,
    )
    cluster.prepare(DATA)
    if image_node is not None:
        as_image_folders(Path(cluster.place.node_data(image_node)))
    cluster.up()
    return cluster


def run_methods(cluster: Cluster, method_runs: dict) -> dict:
    """Each method's ``flwr run`` one after the other: {method: (run, wall seconds)}."""
    runs = {}
    for method, (rounds, extra, overrides) in method_runs.items():
        t0 = time.monotonic()
        run = cluster.flwr_run(
            run_config(cluster, rounds, overrides, METHOD_ROUND_TIMEOUT, **extra), log_name=f"flwr-run-{method}"
        )
        finish(cluster, run, t0 + RUN_DEADLINE + 2 * METHOD_ROUND_TIMEOUT)
        runs[method] = (run, time.monotonic() - t0)
    return runs


def finished_summary(methods: dict, method: str) -> tuple[dict, list[dict]]:
    """A method's run on a methods cluster (``methods``: the fixture's cluster, runs and planned
    rounds) finished every planned round on every node, nothing dropped: (summary, rounds)."""
    cluster, run = methods["cluster"], methods["runs"][method]
    assert run.popen.returncode == 0 and "pflower summary" in run.text(), run.text()[-4000:]
    rounds = cluster.rounds(method)
    assert [r["round"] for r in rounds] == list(range(1, methods["planned"][method] + 1))
    assert all(r["clients"] == list(range(METHOD_NODES)) and not r["dropped"] for r in rounds), rounds
    return json.loads((cluster.run_dir(method) / "summary.json").read_text()), rounds
