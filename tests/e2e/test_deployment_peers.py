"""End-to-end deployment, the methods both peer libraries carry (FL-bench and PFLlib: FedRoD,
APFL, Per-FedAvg, pFedMe, FedALA, FedProto, FedPAC, FedAS): each method's run one after the other
on a methods cluster of its own (deployment.method_cluster: 2 SuperNodes over loopback, TLS and
node auth, warm ClientApps), a work unit of its own beside test_deployment_methods.py's."""

from __future__ import annotations

import time

import pytest
from deployment import finished_summary, method_cluster, run_methods, write_timings

pytestmark = pytest.mark.slow

PEER_METHODS = ("fedrod", "apfl", "perfedavg", "pfedme", "fedala", "fedproto", "fedpac", "fedas")
# two rounds each, so that the second reads what the first left (a kept model or head, the
# server's per-client classifier, the prototypes, the Fisher weights); one local epoch: what is
# tested is the messages and the state, not the fit
RUNS = {m: (2, {"method": m, "local_epochs": 1}, "") for m in PEER_METHODS}


@pytest.fixture(scope="module")
def peers(tmp_path_factory):
    cluster = method_cluster(tmp_path_factory.mktemp("peers"), image_node=None)
    try:
        t0 = time.monotonic()
        runs = run_methods(cluster, RUNS)
        write_timings(
            cluster, {**{f"{m}_wall_s": round(t, 1) for m, (_, t) in runs.items()}, "all_s": time.monotonic() - t0}
        )
        yield {"cluster": cluster, "runs": {m: r for m, (r, _) in runs.items()}, "planned": {m: 2 for m in RUNS}}
    finally:
        cluster.close()


@pytest.mark.parametrize("method", PEER_METHODS)
def test_the_peer_libraries_methods_run_over_a_real_deployment(peers, method):
    """Each runs its two rounds on both nodes, every reply valid, something travelling up, and the
    clients' trained models beat what they started from (round 1's test_before, the untrained
    model) on their own test splits."""
    summary, rounds = finished_summary(peers, method)
    assert summary["method"] == method and all(r["bytes_up"] > 0 for r in rounds), rounds
    assert rounds[-1]["test_after_acc"] > rounds[0]["test_before_acc"] + 0.05, rounds
