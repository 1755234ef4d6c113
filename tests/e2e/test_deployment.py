"""End-to-end: a real SuperLink, a ServerApp SuperExec and SuperNodes as separate processes.

TLS and SuperNode authentication are on (demo CA from scripts/gen_certs.py, node keys
registered with `flwr supernode register`), each SuperNode reads its own data directory
(dataset=local) and keeps its state in its own directory, and the job is a short FedCMD run
started with `flwr run . pflower`. The process layout comes from docker/topology.yaml
(tests/e2e/e2e_cluster.py), the same description docker/compose.yaml is generated from.

Two deployments are started, each once per module, and several tests read their results:
- loopback: 4 SuperNodes; node 3 tampers with its replies (wrong shape, NaN weights, forged
  count: the `test-fault` test hook of client_app/runtime.py); node 1 is killed in the middle
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
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from e2e_cluster import ROOT, Cluster, NetNS, Proc, client_rounds, train_messages_received, wait_for

from pflower.client_app.state import read_state_file

pytestmark = pytest.mark.slow

ROUND_TIMEOUT = 45  # s; a SIGKILLed SuperNode is only declared offline by the SuperLink after up to 60 s
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


# ----------------------------------------------------------------------------- loopback deployment


@pytest.fixture(scope="module")
def loopback(tmp_path_factory):
    """4 SuperNodes over loopback: tampering node 3, node 1 killed mid-round 3 and restarted, a rogue node."""
    tmp = tmp_path_factory.mktemp("loopback")
    cluster = Cluster(tmp, nodes=4, extra_keys=1, node_config={3: {"test-fault": "shape,nan,count"}})
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
        # node 1 is back 45-60 s after the kill (the SuperLink refuses it until two missed
        # heartbeats mark it offline) while round 3 waits out its 45 s timeout; rounds 4+ take
        # ~16 s here, so 5 rounds left it only round 5 (a CI run missed even that): 7 leave margin
        rounds = 7
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
    expected = {"shape": "has shape", "nan": "NaN or infinite", "count": "does not match"}
    kinds = ["shape", "nan", "count"]
    for r in rounds:
        assert 3 not in r["clients"], r
        reasons = [d["reason"] for d in r["dropped"] if d["client"] == 3]
        kind = kinds[(r["round"] - 1) % 3]
        assert len(reasons) == 1 and expected[kind] in reasons[0], (r["round"], kind, reasons)
        # what was aggregated stayed finite: every accepted client evaluates it fine next round
        assert math.isfinite(r["test_before_loss"]) and math.isfinite(r["test_after_loss"])
        assert {0, 2} <= set(r["clients"])
    log = loopback["run"].text()
    assert "dropped reply of client 3" in log  # the strategy logs each rejection
    summary = json.loads((loopback["cluster"].run_dir() / "summary.json").read_text())
    assert math.isfinite(summary["final_loss"]) and summary["final_acc"] > 0.5


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


# ----------------------------------------------------------------------------- network namespaces


@pytest.fixture(scope="module")
def namespaced(tmp_path_factory):
    """3 SuperNodes, each in its own network namespace; node 2's link cut mid-round 2.

    The link comes back when round 2 ends. The node then reconnects on its own, after a backoff
    of up to 20 s (flwr's MAX_RETRY_DELAY, with jitter), so which round it is back for varies:
    the fixture records how many rounds had ended when it logged its reconnection.
    """
    why = NetNS.available()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("netns")
    netns = NetNS(3)
    cluster = Cluster(tmp, nodes=3, netns=netns)
    timings: dict = {}
    try:
        netns.setup()
        cluster.prepare(DATA)
        t0 = time.monotonic()
        cluster.up()
        timings["up_s"] = time.monotonic() - t0
        # enough rounds after the rejoin on a fast machine too: node 2 is back at most ~85 s after
        # the cut (offline after 2 missed heartbeats, <= 60 s; then flwr's backoff, <= 20 s + 5 s)
        rounds = 8
        run, t_run, deadline = run_until_node_has_round(cluster, rounds, node=2, rnd=2)
        t_cut = time.monotonic()
        netns.cut(2)
        wait_for(lambda: len(cluster.rounds()) >= 2 or not run.alive(), deadline - time.monotonic(), "round 2 to end")
        t_round2 = time.monotonic()
        # the link stays down until the SuperLink has marked the node offline, so that "online"
        # afterwards means a heartbeat over the restored link (not a stale online_until)
        wait_for(
            lambda: cluster.node_status(2) == "offline" or not run.alive(),
            deadline - time.monotonic(),
            "the SuperLink to mark node 2 offline",
            interval=2,
        )
        t_offline = time.monotonic()
        netns.restore(2)
        # back when the SuperLink lists it online again: the node list the strategy samples from
        wait_for(
            lambda: cluster.node_status(2) == "online" or not run.alive(),
            deadline - time.monotonic(),
            "node 2 to be online again",
            interval=1,
        )
        rounds_before_rejoin = len(cluster.rounds())
        t_rejoin = time.monotonic()
        finish(cluster, run, deadline)
        timings.update(
            run_wall_s=time.monotonic() - t_run,
            cut_to_round_end_s=t_round2 - t_cut,
            cut_to_offline_s=t_offline - t_cut,
            restore_to_online_s=t_rejoin - t_offline,
            rounds_before_rejoin=rounds_before_rejoin,
            round_time_s=[round(r.get("round_time_s", 0), 1) for r in cluster.rounds()],
        )
        write_timings(cluster, timings)
        yield {
            "cluster": cluster,
            "run": run,
            "netns": netns,
            "rounds": rounds,
            "rounds_before_rejoin": rounds_before_rejoin,
        }
    finally:
        cluster.close()


def test_namespaced_deployment_runs_over_tls(namespaced):
    cluster, run = namespaced["cluster"], namespaced["run"]
    assert run.popen.returncode == 0, run.text()[-4000:]
    rounds = cluster.rounds()
    assert [r["round"] for r in rounds] == list(range(1, namespaced["rounds"] + 1))
    assert rounds[0]["clients"] == [0, 1, 2]
    # the nodes really reached the SuperLink from their own namespaces' addresses
    link_log = cluster.procs["superlink"].text()
    for i in range(3):
        assert f"{namespaced['netns'].address(i)}:" in link_log, i
    assert cluster.place.superlink_address == namespaced["netns"].gateway


def test_supernode_with_cut_network_is_dropped_like_a_killed_one(namespaced):
    cluster, run = namespaced["cluster"], namespaced["run"]
    r2 = cluster.rounds()[1]
    assert 2 not in r2["clients"] and r2["clients"] == [0, 1]
    reasons = [d["reason"] for d in r2["dropped"] if d["client"] == 2]
    assert len(reasons) == 1 and ("no reply before the round timeout" in reasons[0] or "Node Unavailable" in reasons[0])
    assert "round 2: dropped reply of client 2" in run.text()
    summary = json.loads((cluster.run_dir() / "summary.json").read_text())
    assert summary["rounds"] == namespaced["rounds"] and math.isfinite(summary["final_loss"])
    # every drop is attributed to a client, once (the SuperLink's own "Node Unavailable" replies too)
    for r in cluster.rounds():
        assert all(d["client"] is not None for d in r["dropped"]), r["dropped"]
        assert len({d["client"] for d in r["dropped"]}) == len(r["dropped"]), r["dropped"]
    # once its link is back the node reconnects by itself (same node id: no re-registration) and
    # takes part in every round that starts after the SuperLink lists it online again (round k+1
    # may have sampled before), and in the final evaluation
    k = namespaced["rounds_before_rejoin"]
    assert "Connection successful after" in cluster.procs["supernode-2"].text()
    later = cluster.rounds()[k + 1 :]
    assert later, f"node 2 was online again only after round {k} of {namespaced['rounds']}: no later round to check"
    for r in later:
        assert 2 in r["clients"], (k, r)
    assert summary["final_clients"] == 3


# ----------------------------------------------------------------------------- the newer methods

METHOD_RUNS = {  # method -> (rounds, run-config extras, overrides)
    "fedcpmd": (2, {"method": "fedcpmd"}, "method.kp=1"),  # a vote round, a clustered round
    # the authors' code's phase 2: each node's message is built from the other node's reply
    "fedcmd": (3, {"method": "fedcmd"}, "method.kp=1 method.force_layer=fc2 method.relay_phase2=true"),
    "kapc_bls": (
        2,
        {"method": "kapc_bls", "model": "cnn_kapc", "local_epochs": 1},
        "",
    ),  # round 2 leaves the layers after Omega out
    # the nodes partition the shared digits themselves (client-id, no data-dir): the server keeps a
    # public hold-out; h_th = 0 with psi = 0.5 would halve the shared prefix at every re-clustering,
    # but two clients are too few for the Hopkins statistic (m < 3: no clustering)
    "fedtsdp": (
        2,
        {"method": "fedtsdp", "dataset": "digits", "local_epochs": 1},
        "dataset.public=holdout dataset.public_fraction=0.2 method.h_th=0.0 method.psi=0.5",
    ),
    # the two nodes run different architectures, a ResNet10 and a LeNet-5, both ending in a 32-wide
    # feature (a ResNet crosses the wire; a second ResNet only made the run slower); the server's CVAE trains after
    # round 1 and round 2's clients get its synthetic class features; the group models are
    # evaluated on a public hold-out and crossed for the transfer check
    "velo": (
        2,
        {"method": "velo", "dataset": "digits", "model": "mixed"},
        "optimizer=adam lr=0.001 local_steps=3 method.warmup=0.0 method.cvae_hidden=32 method.cvae_latent=8 "
        "method.cvae_label_dim=8 method.cvae_epochs=2 dataset.public=holdout dataset.public_fraction=0.2 ~model.archs "
        '"+model.archs={r10: {name: resnet10, feature_dim: 32}, le: {name: lenet5, feature_dim: 32}}"',
    ),
    # one LeNet-5 at two widths: node 0 trains the half-width block of the global model, node 1 the
    # whole of it; each computes its BN statistics from its own data before evaluating
    "heterofl": (
        2,
        {"method": "heterofl", "dataset": "digits", "model": "lenet5_widths", "local_epochs": 1},
        '~model.archs "+model.archs={b: {name: lenet5, width: 0.5, scaler: true}, a: {name: lenet5, scaler: true}}"',
    ),
    # two LeNet-5 depths sharing a 16-wide feature: features, logits and labels go up, the server's
    # logits of each node's samples and its model come down (no weights up)
    "fedgkt": (
        2,
        {"method": "fedgkt", "dataset": "digits", "model": "mixed", "local_epochs": 1},
        'method.hidden=[32] ~model.archs "+model.archs={l2: {name: lenet5, fc_layers: 2, feature_dim: 16}, '
        'l3: {name: lenet5, fc_layers: 3, feature_dim: 16}}"',
    ),
    # the labelled transfer split every node reads: transfer learning, then the consensus of round 1
    # digested in round 2 (only scores travel)
    "fedmd": (
        2,
        {"method": "fedmd", "dataset": "digits", "local_epochs": 1},
        "dataset.transfer_fraction=0.2 method.subset=50 method.transfer_epochs=1",
    ),
}
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


@pytest.fixture(scope="module")
def methods(tmp_path_factory):
    """2 SuperNodes over loopback, TLS and node auth; FedCPMD, KAPC+BLS, FedTSDP and Velo on the same deployment.
    The nodes run in ``--isolation process`` beside a ``pflower-superexec`` each: every message's ClientApp
    is forked from a process that imported torch once (the other deployments here use Flower's default,
    a fresh process per message)."""
    tmp = tmp_path_factory.mktemp("methods")
    cluster = Cluster(
        tmp,
        nodes=METHOD_NODES,
        # num-partitions: what the example app's data function reads on a SuperNode
        node_config={i: {"cache-dir": str(tmp / "cache"), "num-partitions": METHOD_NODES} for i in range(METHOD_NODES)},
        isolation="process",
    )
    try:
        cluster.prepare(DATA)
        as_image_folders(Path(cluster.place.node_data(IMAGE_NODE)))
        cluster.up()
        runs = {}
        for method, (rounds, extra, overrides) in METHOD_RUNS.items():
            t0 = time.monotonic()
            run = cluster.flwr_run(
                run_config(cluster, rounds, overrides, METHOD_ROUND_TIMEOUT, **extra), log_name=f"flwr-run-{method}"
            )
            finish(cluster, run, t0 + RUN_DEADLINE + 2 * METHOD_ROUND_TIMEOUT)
            runs[method] = (run, time.monotonic() - t0)
        t0 = time.monotonic()  # a Flower app of a user's own: quickstart-pytorch switched to FedCMD
        example = cluster.flwr_run(None, log_name="flwr-run-example", app=ROOT / "examples" / "quickstart-fedcmd")
        finish(cluster, example, t0 + RUN_DEADLINE + 2 * METHOD_ROUND_TIMEOUT)
        runs["example"] = (example, time.monotonic() - t0)
        write_timings(cluster, {f"{m}_wall_s": round(t, 1) for m, (_, t) in runs.items()})
        yield {"cluster": cluster, "runs": {m: r for m, (r, _) in runs.items()}}
    finally:
        cluster.close()


def finished_summary(methods: dict, method: str) -> tuple[dict, list[dict]]:
    cluster, run = methods["cluster"], methods["runs"][method]
    assert run.popen.returncode == 0 and "pflower summary" in run.text(), run.text()[-4000:]
    rounds = cluster.rounds(method)
    assert [r["round"] for r in rounds] == list(range(1, METHOD_RUNS[method][0] + 1))
    assert all(r["clients"] == list(range(METHOD_NODES)) and not r["dropped"] for r in rounds), rounds
    return json.loads((cluster.run_dir(method) / "summary.json").read_text()), rounds


def test_fedcpmd_clusters_clients_over_a_real_deployment(methods):
    summary, rounds = finished_summary(methods, "fedcpmd")
    assert [r["phase"] for r in rounds] == [1, 2] and summary["probed"] == []
    assert sum(summary["personal_layers"].values()) == METHOD_NODES  # every client has its layer
    assert sorted(c for members in summary["clusters"] for c in members) == list(range(METHOD_NODES))
    assert sum(rounds[-1]["cluster_sizes"]) == METHOD_NODES and summary["final_clients"] == METHOD_NODES
    assert summary["mean_cluster_acc"] > 0.3


def test_fedcmd_relays_phase_2_through_the_nodes_over_a_real_deployment(methods):
    summary, rounds = finished_summary(methods, "fedcmd")
    assert [r["phase"] for r in rounds] == [1, 2, 2] and summary["personal_layer"] == "fc2"
    assert [r.get("relay") for r in rounds] == [None, True, True]
    assert all(r["bytes_down"] > 0 and r["bytes_up"] > 0 for r in rounds)
    assert summary["final_clients"] == METHOD_NODES


def test_fedtsdp_runs_over_a_real_deployment_with_node_cached_partitions(methods):
    summary, rounds = finished_summary(methods, "fedtsdp")
    assert summary["clusters"] == [list(range(METHOD_NODES))] and summary["reclusterings"] == []
    assert all(r["shared_units"] == summary["units"] and "hopkins" not in r for r in rounds)
    assert summary["final_clients"] == METHOD_NODES and summary["headline_test_before_acc"] > 0.1
    # each node wrote its partition once and read it in every later message: the cache holds one
    # file per (data spec, node) of the runs that partition a shared dataset, FedTSDP's among them
    from omegaconf import OmegaConf

    from pflower.federated_data import DataSpec
    from pflower.federated_data.node_cache import cache_path
    from pflower.server_app.config import data_spec_dict

    cache = methods["cluster"].tmp / "cache"
    expected: dict[str, set[str]] = {}
    for method in METHOD_RUNS:
        spec = DataSpec.from_dict(data_spec_dict(OmegaConf.load(methods["cluster"].run_dir(method) / "config.yaml")))
        if not spec.info.node_local:
            expected[method] = {cache_path(cache, spec.to_dict(), c).name for c in range(METHOD_NODES)}
    assert len(expected["fedtsdp"]) == METHOD_NODES
    assert {p.name for p in (cache / "partitions").glob("*.npz")} == set().union(*expected.values())
    # the ClientApps ran in the node's pflower-superexec (its log), each one forked, not started afresh
    apps_log = methods["cluster"].procs["clientapp-0"].text()
    assert "cold start" in apps_log and "setup" in apps_log
    assert "cold start" not in methods["cluster"].procs["supernode-0"].text()


def test_warm_clientapps_start_without_importing_torch_again(methods):
    """pflower-superexec: every message's ClientApp is a fork of a process that imported torch, so
    its cold start (process start to its first message) is shorter than importing torch alone,
    which a fresh flwr-clientapp process does first (4.5-5.7 s of cold start in benchmarks/)."""
    apps_log = methods["cluster"].procs["clientapp-0"].text()
    cold = [float(x) for x in re.findall(r"cold start ([0-9.]+) s", apps_log)]
    assert len(cold) >= sum(rounds for rounds, _, _ in METHOD_RUNS.values()), apps_log[
        -3000:
    ]  # one per training message
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    torch_import = time.monotonic() - t0
    assert statistics.median(cold) < torch_import, (cold, torch_import)
    assert "Traceback" not in apps_log, apps_log[-3000:]


def test_kapc_bls_coaches_and_cuts_bytes_over_a_real_deployment(methods):
    summary, rounds = finished_summary(methods, "kapc_bls")
    # round 1: the server has heard from nobody, so it sends no regularizer (unheard=skip)
    assert (
        rounds[0]["bytes_down"] == 0
        and rounds[0]["unheard_layers"] == METHOD_NODES * 5
        and rounds[0]["masked_layers"] == 0
    )
    # round 2: each client is coached on the layers it uploaded (Omega = L - 1 at a first
    # participation), never on the classifier after them (Eq. 20), so it gets at most what it sent
    assert rounds[1]["unheard_layers"] == 0 and rounds[1]["masked_layers"] >= METHOD_NODES
    assert 0 < rounds[1]["bytes_down"] <= rounds[0]["bytes_up"]
    assert all(3 <= o <= 5 for r in rounds for o in r["omega"].values())  # omega_min = L - 2 = 3
    assert summary["best_mean_acc"] > 0.3 and summary["artifacts"] == ["cube.npy", "cube.png"]
    assert (methods["cluster"].run_dir("kapc_bls") / "cube.png").stat().st_size > 5000


def test_velo_runs_two_architectures_over_a_real_deployment(methods):
    summary, rounds = finished_summary(methods, "velo")
    assert [r["distill"] for r in rounds] == [0, 1] and summary["cvae_trainings"] == 2
    assert all(r["known_classes"] == 10 and {"global_acc@r10", "global_acc@le"} <= set(r) for r in rounds)
    assert set(summary["transfer_acc"]) == {"r10", "le"} and summary["final_clients"] == METHOD_NODES
    assert rounds[1]["bytes_down"] > rounds[0]["bytes_down"]  # + the class knowledge (S, P, M) in round 2


def test_heterofl_trains_two_widths_of_one_model_over_a_real_deployment(methods):
    summary, rounds = finished_summary(methods, "heterofl")
    assert all(r["clients@a"] == r["clients@b"] == 1 for r in rounds)
    assert {"final_acc@a", "final_acc@b"} <= set(summary)
    assert summary["final_clients"] == METHOD_NODES


def test_fedgkt_trains_the_server_model_on_the_nodes_features_over_a_real_deployment(methods):
    summary, rounds = finished_summary(methods, "fedgkt")
    assert all(r["stored_clients"] == METHOD_NODES and 0.0 <= r["server_acc"] <= 1.0 for r in rounds)
    assert rounds[1]["bytes_down"] > rounds[0]["bytes_down"]  # + the server's logits of each node's samples
    assert summary["final_clients"] == METHOD_NODES and "final_global_acc" not in summary  # digits: no public split


def test_fedmd_shares_only_scores_over_a_real_deployment(methods):
    summary, rounds = finished_summary(methods, "fedmd")
    assert all(r["consensus_clients"] == METHOD_NODES for r in rounds)
    assert rounds[0]["bytes_down"] < rounds[1]["bytes_down"]  # round 2 brings round 1's consensus
    assert summary["final_clients"] == METHOD_NODES


def test_a_supernode_holding_image_folders_trains_in_every_run(methods):
    cluster = methods["cluster"]
    logs = "".join(proc.text() for name, proc in cluster.procs.items() if name.endswith(f"-{IMAGE_NODE}"))
    assert f"client {IMAGE_NODE}: " in logs and "images from the image folders under" in logs, logs[-3000:]
    for method in ("fedcpmd", "kapc_bls"):
        assert all(IMAGE_NODE in r["clients"] for r in cluster.rounds(method)), method


def test_the_quickstart_app_switched_to_fedcmd_runs_on_the_deployment(methods):
    """examples/quickstart-fedcmd, shipped as its own FAB to the TLS deployment: its ServerApp's
    FedCMD drives build_clientapp's ClientApps on the app's own Net and data."""
    run = methods["runs"]["example"]
    text = run.text()
    assert run.popen.returncode == 0 and "Traceback" not in text, text[-4000:]
    assert "layer groups: conv1, conv2, fc1, fc2, fc3" in text and "[round   4/4]" in text, text[-3000:]
    assert 'quickstart-fedcmd: {"personal_layer": "fc' in text


def test_a_warm_superexec_serves_its_supernode_again_after_the_node_restarts(methods):
    """Runs last on the ``methods`` deployment (the tests above only read its finished runs): the
    SuperNode is stopped and restarted as a supervisor would; its pflower-superexec (same process)
    reconnects to the node's Runtime API by itself and forks the next run's ClientApps."""
    cluster = methods["cluster"]
    superexec = cluster.procs["clientapp-0"]
    pid = superexec.pid
    cluster.procs["supernode-0"].stop()
    assert superexec.alive()
    restart_until_active(cluster, 0, time.monotonic() + 200)
    served_before = len(re.findall(r"cold start", superexec.text()))
    t0 = time.monotonic()
    run = cluster.flwr_run(
        run_config(cluster, 1, "", METHOD_ROUND_TIMEOUT, method="fedavg"), log_name="flwr-run-after-restart"
    )
    finish(cluster, run, t0 + RUN_DEADLINE)
    assert run.popen.returncode == 0, run.text()[-3000:]
    assert [(r["round"], r["clients"]) for r in cluster.rounds("fedavg")] == [(1, list(range(METHOD_NODES)))]
    assert superexec.alive() and superexec.pid == pid
    assert len(re.findall(r"cold start", superexec.text())) > served_before
