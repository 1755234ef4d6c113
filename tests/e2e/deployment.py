"""What the deployment tests share (test_deployment*.py, one file per cluster so that each
cluster is its own xdist work unit, tests/conftest.py): the run's settings and the waits."""

from __future__ import annotations

import json
import time

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
