"""End-to-end: a real SuperLink, a ServerApp SuperExec and SuperNodes as separate processes.

TLS and SuperNode authentication are on (demo CA from scripts/gen_certs.py, node keys
registered with `flwr supernode register`), each SuperNode reads its own data directory
(dataset=local) and keeps its state in its own directory, and the job is a short FedCMD run
started with `flwr run . pflower`. The process layout comes from docker/topology.yaml
(tests/e2e/e2e_cluster.py), the same description docker/compose.yaml is generated from.

Three deployments are started, one per file (test_deployment.py, test_deployment_netns.py,
test_deployment_methods.py: each file is an xdist work unit, so two workers build two of them at
once), and several tests read each one's results:
- loopback: 4 SuperNodes; node 3 tampers with its replies (wrong shape, NaN weights, forged
  count: the `test-fault` test hook of client_app/runtime.py) and sends one reply after its
  round's timeout; node 1 is killed in the middle
  of round 3 and restarted with the same client id, key, data and state directories; a fifth
  SuperNode holding an unregistered key tries to join;
- network namespaces (when this machine allows creating them): 3 SuperNodes with their own
  addresses; node 2's link is cut in the middle of round 2 and restored after it;
- methods: 2 SuperNodes over loopback, no faults, running the methods that keep per-client state
  on both sides one after the other (FedCPMD: votes, clusters, whole client models; KAPC+BLS:
  the cube, regularizers as extra arrays, client-chosen upload prefixes).

Each deployment is bounded in time and every process it starts is stopped afterwards.
Timings (wall time of a run, recovery after a kill) are printed and written to
<tmp>/timings.json.
"""

from __future__ import annotations

import json
import math
import time

import pytest
from deployment import (
    DATA,
    KP,
    finish,
    restart_until_active,
    run_until_node_has_round,
    write_timings,
)
from e2e_cluster import Cluster, client_rounds, wait_for

from pflower.client_app.state import read_state_file

pytestmark = pytest.mark.slow

# node 3's replies, one kind a round (cycled): tampered ones the server rejects, and in round 3
# (which waits out its timeout anyway: node 1 is killed in it) a valid reply held back 48 s after
# its ClientApp started (so past the 45 s timeout), which the server must refuse when it arrives
# during a later round. The node runs one message at a time, so its round-4 message starts only
# after that hold: on a loaded machine its tampered round-4 reply can itself miss round 4's timeout
# (a clean-clone run with the compose build beside it). Hence the tampered kinds before round 3
# and shape twice after it: every kind is rejected for its own reason at least once, and a round
# after the held reply may instead drop node 3 for its timeout.
NODE3_KINDS = ["count", "nan", "slow:48", "shape", "shape", "nan"]
SLOW_ROUND = NODE3_KINDS.index("slow:48") + 1
NODE3_FAULTS = ",".join(NODE3_KINDS)


# ----------------------------------------------------------------------------- loopback deployment


@pytest.fixture(scope="module")
def loopback(tmp_path_factory):
    """4 SuperNodes over loopback: tampering node 3, node 1 killed mid-round 3 and restarted, a rogue node."""
    tmp = tmp_path_factory.mktemp("loopback")
    cluster = Cluster(tmp, nodes=4, extra_keys=1, node_config={3: {"test-fault": NODE3_FAULTS}})
    timings: dict = {}
    try:
        t0 = time.monotonic()
        cluster.prepare(DATA)
        cluster.up()
        timings["up_s"] = time.monotonic() - t0
        # a SuperNode with a key pair that was never registered, claiming to be client 1
        rogue = cluster.start(
            "rogue", cluster.node_argv(1, key_index=4, **{"state-dir": str(tmp / "rogue-state")}), "rogue"
        )
        # node 1 is let back in about 20 s after the kill (the SuperLink refuses it until two
        # missed heartbeats mark it offline: pflower-supernode's 10 s interval, the topology's)
        # while round 3 waits out its 45 s timeout, and first replies in round 4 (measured; with
        # Flower's 30 s interval it came back 45-60 s after the kill and 7 rounds were needed): 6
        # leave two rounds of margin
        rounds = 6
        # kill node 1 as soon as it has received its round-3 train message (mid-round: no reply yet)
        run, t_run, deadline = run_until_node_has_round(cluster, rounds, node=1, rnd=3)
        node1 = cluster.procs["supernode-1"]
        assert 3 not in client_rounds(node1.text()), "node 1 replied before it could be killed"
        t_kill = time.monotonic()
        cluster.kill_node(1)
        # what node 1 had persisted when it died (nothing writes it until it is back)
        state_file = next((tmp / "state" / "node-1").glob("*/client_1.pt"))
        saves = read_state_file(state_file)
        persisted = sorted(saves[max(saves)])
        t_restart, refused = restart_until_active(cluster, 1, deadline)
        restarted = cluster.procs["supernode-1"]
        # its first reply after the restart, then the round record that accepted it
        first = wait_for(
            lambda: min(client_rounds(restarted.text()), default=None) or not run.alive(),
            deadline - time.monotonic(),
            "node 1's first reply",
        )
        assert first is not True, (
            f"the run ended before node 1 (restarted {time.monotonic() - t_restart:.0f} s ago) replied"
        )
        t_reply = time.monotonic()
        wait_for(
            lambda: any(r["round"] >= first and 1 in r["clients"] for r in cluster.rounds()) or not run.alive(),
            deadline - time.monotonic(),
            "the server to accept node 1's reply",
        )
        t_accepted = time.monotonic()
        finish(cluster, run, deadline)
        t_end = time.monotonic()
        timings.update(
            run_wall_s=t_end - t_run,
            kill_after_run_start_s=t_kill - t_run,
            restart_after_kill_s=t_restart - t_kill,
            restarts_refused_while_still_online=refused,
            restart_to_first_reply_s=t_reply - t_restart,
            restart_to_accepted_s=t_accepted - t_restart,
            first_round_after_restart=first,
            round_time_s=[round(r.get("round_time_s", 0), 1) for r in cluster.rounds()],
        )
        write_timings(cluster, timings)
        yield {
            "cluster": cluster,
            "run": run,
            "rogue": rogue,
            "rounds": rounds,
            "before_kill": client_rounds(node1.text()),
            "after_restart": client_rounds(restarted.text()),
            "first_after_restart": first,
            "persisted_at_kill": persisted,
        }
    finally:
        cluster.close()


def test_fedcmd_over_tls_with_node_auth_writes_results(loopback):
    cluster, run = loopback["cluster"], loopback["run"]
    log = run.text()
    assert run.popen.returncode == 0, log[-4000:]
    assert "pflower summary" in log
    run_dir = cluster.run_dir()
    rounds = cluster.rounds()
    assert [r["round"] for r in rounds] == list(range(1, loopback["rounds"] + 1))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["dataset"] == "local" and summary["method"] == "fedcmd" and summary["num_clients"] == 4
    assert summary["personal_layer"] in ("fc1", "fc2", "classifier") and summary["kp"] == KP
    assert summary["final_clients"] == 4  # the restarted node and the tampering node evaluate too
    assert (run_dir / "config.yaml").exists() and (run_dir / "accuracy.png").stat().st_size > 1000
    assert [r["phase"] for r in rounds] == [1] * KP + [2] * (len(rounds) - KP)
    # TLS on every API (the SuperLink serves HTTPS only) and node auth enabled
    link_log = cluster.procs["superlink"].text()
    assert "Uvicorn running on https://" in link_log and "SuperNode authentication is disabled" not in link_log
    assert "registered" in cluster.registration


def test_supernode_without_registered_key_is_refused(loopback):
    rogue = loopback["rogue"]
    wait_for(lambda: not rogue.alive(), 30, "the rogue SuperNode to give up")
    assert rogue.popen.returncode != 0
    assert "Failed to activate SuperNode" in rogue.text(), rogue.text()[-2000:]
    assert "Start `flwr-clientapp` process" not in rogue.text()  # it never received a message


def test_tampered_replies_are_rejected_and_the_global_model_is_unharmed(loopback):
    rounds = loopback["cluster"].rounds()
    expected = {
        "shape": "has shape",
        "nan": "NaN or infinite",
        "count": "does not match",
        "slow:48": "no reply before the round timeout",
    }
    seen = set()
    for r in rounds:
        assert 3 not in r["clients"], r
        reasons = [d["reason"] for d in r["dropped"] if d["client"] == 3]
        kind = NODE3_KINDS[(r["round"] - 1) % len(NODE3_KINDS)]
        assert len(reasons) == 1, (r["round"], kind, reasons)
        if expected[kind] in reasons[0]:
            seen.add(kind)
        else:  # only after the held reply, and then only its next message's timeout
            assert r["round"] > SLOW_ROUND and expected["slow:48"] in reasons[0], (r["round"], kind, reasons)
        # what was aggregated stayed finite: every accepted client evaluates it fine next round
        assert math.isfinite(r["test_before_loss"]) and math.isfinite(r["test_after_loss"])
        assert {0, 2} <= set(r["clients"])
    assert seen == set(expected), (seen, [(r["round"], r["dropped"]) for r in rounds])
    log = loopback["run"].text()
    assert "dropped reply of client 3" in log  # the strategy logs each rejection
    summary = json.loads((loopback["cluster"].run_dir() / "summary.json").read_text())
    assert math.isfinite(summary["final_loss"]) and summary["final_acc"] > 0.5


def test_a_reply_that_comes_after_its_round_closed_is_refused_and_logged(loopback):
    rounds = loopback["cluster"].rounds()
    late = [(r["round"], x["client"], x["round"], x["late_s"]) for r in rounds for x in r.get("late_replies", [])]
    # node 3's round-3 reply (held 48 s from its ClientApp's start; timeout 45 s): listed by the round it came in
    came_in = [(at, late_s) for at, client, answered, late_s in late if (client, answered) == (3, 3)]
    assert len(came_in) == 1 and came_in[0][0] > 3 and came_in[0][1] > 0, late
    assert all(answered < at for at, _, answered, _ in late), late
    assert "late reply of client 3 to round 3" in loopback["run"].text()
    assert "reply held back 48.0 s on purpose" in loopback["cluster"].procs["supernode-3"].text()


def test_killed_supernode_round_completes_and_restart_restores_personal_layers(loopback):
    cluster, rounds = loopback["cluster"], loopback["cluster"].rounds()
    r3 = rounds[2]
    assert 1 not in r3["clients"] and {0, 2} <= set(r3["clients"])
    reasons = [d["reason"] for d in r3["dropped"] if d["client"] == 1]
    assert len(reasons) == 1 and ("no reply before the round timeout" in reasons[0] or "Node Unavailable" in reasons[0])
    assert "round 3: dropped reply of client 1" in loopback["run"].text()
    assert loopback["run"].popen.returncode == 0 and len(rounds) == loopback["rounds"]
    # after the restart: same client id, state read back from its state directory
    first = loopback["first_after_restart"]
    after = loopback["after_restart"][first]
    assert after["client"] == 1 and after["restored"] > 0
    assert any(1 in r["clients"] for r in rounds if r["round"] >= first)
    # what it restored is what it had persisted before the kill, personal layer l* included
    persisted = loopback["persisted_at_kill"]
    layer = json.loads((cluster.run_dir() / "summary.json").read_text())["personal_layer"]
    assert after["restored"] == len(persisted) and any(f".{layer}." in k for k in persisted), persisted
    # not reset to the untrained level: the untrained model (round 1's test_before, which is the
    # run's seeded initial model) versus what it evaluates right after the restart
    untrained = loopback["before_kill"][1]["test_before"]
    assert abs(untrained - untrained_accuracy(cluster, 1)) < 1e-3
    before = loopback["before_kill"][2]["test_after"]  # round 2: its last reply before the kill
    print(
        f"[e2e] node 1: untrained {untrained:.3f}, test_after before kill {before:.3f}, "
        f"test_before after restart (round {first}) {after['test_before']:.3f}"
    )
    assert after["test_before"] >= untrained + 0.2
    assert after["test_before"] >= 0.75 * before


def untrained_accuracy(cluster: Cluster, client: int) -> float:
    """Accuracy of the run's initial model (same seed) on a client's own test split."""
    import yaml

    from pflower.client_app.runtime import client_data
    from pflower.client_app.training import evaluate
    from pflower.federated_data import DataSpec
    from pflower.models import build_model

    cfg = yaml.safe_load((cluster.run_dir() / "config.yaml").read_text())
    spec = {"data": {k: v for k, v in data_spec(cfg).items()}}
    data = client_data(spec, client, {"data-dir": cluster.place.node_data(client)})
    info = DataSpec.from_dict(spec["data"]).info
    model_kwargs = {k: v for k, v in cfg["model"].items() if k != "name"}
    model = build_model(cfg["model"]["name"], info.in_shape, info.num_classes, seed=int(cfg["seed"]), **model_kwargs)
    correct, _, n = evaluate(model, data.x_test, data.y_test)
    return correct / n


def data_spec(cfg: dict) -> dict:
    from omegaconf import OmegaConf

    from pflower.server_app.config import data_spec_dict

    return data_spec_dict(OmegaConf.create(cfg))
