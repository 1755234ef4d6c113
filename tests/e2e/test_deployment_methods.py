"""End-to-end deployment, the newer methods: 2 SuperNodes over loopback, TLS and node auth, no
faults, each method's run one after the other on the same deployment (test_deployment.py says
what the deployments share)."""

from __future__ import annotations

import re
import time

import pytest
from deployment import (
    IMAGE_NODE,
    METHOD_NODES,
    METHOD_ROUND_TIMEOUT,
    RUN_DEADLINE,
    finish,
    finished_summary,
    method_cluster,
    restart_until_active,
    run_config,
    run_methods,
    write_timings,
)
from e2e_cluster import ROOT

pytestmark = pytest.mark.slow


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


@pytest.fixture(scope="module")
def methods(tmp_path_factory):
    """FedCPMD, FedCMD's relay, KAPC+BLS, FedTSDP, Velo, HeteroFL, FedGKT, FedMD and the example app
    on one :func:`method_cluster`."""
    cluster = method_cluster(tmp_path_factory.mktemp("methods"))
    try:
        runs = run_methods(cluster, METHOD_RUNS)
        t0 = time.monotonic()  # a Flower app of a user's own: quickstart-pytorch switched to FedCMD
        example = cluster.flwr_run(None, log_name="flwr-run-example", app=ROOT / "examples" / "quickstart-fedcmd")
        finish(cluster, example, t0 + RUN_DEADLINE + 2 * METHOD_ROUND_TIMEOUT)
        runs["example"] = (example, time.monotonic() - t0)
        write_timings(cluster, {f"{m}_wall_s": round(t, 1) for m, (_, t) in runs.items()})
        planned = {m: rounds for m, (rounds, _, _) in METHOD_RUNS.items()}
        yield {"cluster": cluster, "runs": {m: r for m, (r, _) in runs.items()}, "planned": planned}
    finally:
        cluster.close()


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
    it does not import torch again (a fresh flwr-clientapp process does first: 4.5-5.7 s of cold
    start in benchmarks/). Judged by the event, each ClientApp's own report that it is a fork of
    the fork server, not by comparing its cold start with a torch import timed now: on a machine
    running other work the two timings were taken under different loads."""
    apps_log = methods["cluster"].procs["clientapp-0"].text()
    cold = re.findall(r"cold start [0-9.]+ s[^\n]*", apps_log)
    assert len(cold) >= sum(rounds for rounds, _, _ in METHOD_RUNS.values()), apps_log[
        -3000:
    ]  # one per training message
    assert all("a fork of pflower-superexec's fork server" in line for line in cold), cold
    assert "Traceback" not in apps_log, apps_log[-3000:]
    # one SuperExec served both nodes, each node's ClientApps installing the runs' apps in a home of its own
    cluster = methods["cluster"]
    homes = cluster.tmp / "flwr" / "clientapps"
    for i in range(METHOD_NODES):
        apps = list((homes / f"superexec-127.0.0.1-{cluster.runtime_ports[i]}" / "apps").iterdir())
        assert len(apps) >= 2, apps  # pflower's FAB (the methods' runs) and the example app's


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
    # the node's SuperNode and the SuperExec that forks every node's ClientApps
    logs = "".join(p.text() for name, p in cluster.procs.items() if name in (f"supernode-{IMAGE_NODE}", "clientapp-0"))
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
    assert "phase 2 | personal_layer fc" in text  # the vote chose a layer and FedCMD's phase 2 ran
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
