"""`pflower sim backend=ray ray.address=...` joins a Ray cluster that is already running: a head
and a second node, both on loopback, started by this test with their own ports and temp
directory (Ray's ``cluster_utils.Cluster``, the multi-node set-up Ray tests itself with) and
stopped by it. ClientApp actors run on both nodes, and the numbers equal a local run's."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from integration.test_simulation import without_timings

BIN = Path(sys.executable).parent
SMALL = [
    "num_clients=4",
    "rounds=2",
    "local_epochs=1",
    "fraction=1.0",
    "partition.min_size=20",
    "alpha=1.0",
    "method=fedper",
    "progress=false",
]

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(out: Path) -> list[dict]:
    (run,) = [p for p in out.glob("*/*") if p.is_dir()]
    return [without_timings(json.loads(x)) for x in (run / "metrics.jsonl").read_text().splitlines()]


def sim(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "pflower"), "sim", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="module")
def cluster():
    """A Ray head and a second node on loopback, one CPU each, with their own port and temp
    directory; stopped at the end of the module, and every process of it checked gone."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    # Ray rewrites 127.0.0.1 in an address to this machine's outward IP (to reach a cluster of
    # several machines); with its "no multi-machine clusters" switch it keeps loopback, so the
    # whole cluster, this process and the runs (which inherit the variable) stay on 127.0.0.1
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "0")
        mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        # a short directory: Ray's unix sockets live under it (the path limit is 107 bytes)
        ray_tmp = Path(tempfile.mkdtemp(prefix="prc", dir="/tmp"))
        port = free_port()
        head = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "gcs_server_port": port,
                "include_dashboard": False,
                "temp_dir": str(ray_tmp),
                "node_ip_address": "127.0.0.1",
            },
        )
        pids: list[int] = []
        try:
            worker = head.add_node(num_cpus=1, node_ip_address="127.0.0.1")
            pids = [
                p.process.pid for node in (head.head_node, worker) for ps in node.all_processes.values() for p in ps
            ]
            assert head.address.endswith(f":{port}")
            yield f"127.0.0.1:{port}"
        finally:
            head.shutdown()
            shutil.rmtree(ray_tmp, ignore_errors=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.5)
    assert not [p for p in pids if _alive(p)], "a Ray process of the test's cluster outlived it"


def cluster_state(address: str) -> tuple[dict[str, str], set[str]]:
    """The cluster's ClientApp actors (id -> node id, from the GCS actor table: dead actors stay
    listed) and its live nodes, read over one connection."""
    import ray

    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        actors = ray._private.state.actors()
        clients = {
            a_id: a["Address"]["NodeID"] for a_id, a in actors.items() if "ClientAppActor" in a["ActorClassName"]
        }
        return clients, {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    finally:
        ray.shutdown()


def new_actor_nodes(address: str, before: dict[str, str]) -> tuple[set[str], set[str]]:
    """The nodes that ran ClientApp actors not in ``before``, and the cluster's live nodes."""
    clients, alive = cluster_state(address)
    return {node for a, node in clients.items() if a not in before}, alive


def test_a_run_joins_a_two_node_ray_cluster_and_writes_the_local_numbers(cluster, tmp_path):
    before, _ = cluster_state(cluster)
    env = {**os.environ, "RAY_ADDRESS": ""}  # only the key may point the run at the cluster
    joined = sim([*SMALL, "backend=ray", f"ray.address={cluster}", f"output_dir={tmp_path / 'cluster'}"], tmp_path, env)
    assert joined.returncode == 0, joined.stdout[-3000:] + joined.stderr[-3000:]
    local = sim([*SMALL, "backend=serial", f"output_dir={tmp_path / 'local'}"], tmp_path)
    assert local.returncode == 0, local.stderr[-3000:]
    assert metrics(tmp_path / "cluster") == metrics(tmp_path / "local")
    ran, alive = new_actor_nodes(cluster, before)
    assert len(alive) == 2 and ran == alive, (ran, alive)


def test_a_sweep_runs_two_at_a_time_on_the_cluster_with_the_numbers_of_one_by_one(cluster, tmp_path):
    """`pflower sim -m seed=1,2 --jobs 2 backend=ray ray.address=...`: two drivers share the
    cluster's two CPUs (the second's actors wait for the first's), and each run's numbers equal
    the same seed run alone on this machine."""
    before, _ = cluster_state(cluster)
    env = {**os.environ, "RAY_ADDRESS": ""}
    sweep = sim(
        [
            "-m",
            "seed=1,2",
            "--jobs",
            "2",
            *SMALL,
            "backend=ray",
            f"ray.address={cluster}",
            f"output_dir={tmp_path / 'cluster'}",
        ],
        tmp_path,
        env,
    )
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    assert "[run 1/2]" in sweep.stdout and "[run 2/2]" in sweep.stdout
    ran, alive = new_actor_nodes(cluster, before)
    assert ran == alive, (ran, alive)
    for seed in (1, 2):
        local = sim([*SMALL, f"seed={seed}", "backend=serial", f"output_dir={tmp_path / f'local{seed}'}"], tmp_path)
        assert local.returncode == 0, local.stderr[-3000:]
    by_seed = {}
    for run in (tmp_path / "cluster").glob("*/*"):
        by_seed[yaml.safe_load((run / "config.yaml").read_text())["seed"]] = [
            without_timings(json.loads(x)) for x in (run / "metrics.jsonl").read_text().splitlines()
        ]
    assert sorted(by_seed) == [1, 2]
    for seed in (1, 2):
        assert by_seed[seed] == metrics(tmp_path / f"local{seed}"), seed
    assert by_seed[1] != by_seed[2]


def test_flwr_run_joins_the_cluster_named_by_ray_address(cluster, tmp_path):
    """`flwr run .` with a simulation federation: the local SuperLink it starts inherits
    RAY_ADDRESS, and its simulation runtime's ray.init() joins that cluster; the ClientApp actors
    run on both nodes and the numbers equal `pflower sim backend=serial`'s."""
    from integration.test_simulation import ROOT, stop_local_superlink

    before, _ = cluster_state(cluster)
    out = tmp_path / "flwr"
    env = {
        **os.environ,
        "RAY_ADDRESS": cluster,
        "FLWR_HOME": str(tmp_path / "flwr-home"),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    # SMALL as run config: its flwr keys, and the rest as hydra overrides
    run_config = (
        f"method='fedper' num_clients=4 rounds=2 local_epochs=1 fraction=1.0 output_dir='{out}' "
        "overrides='partition.min_size=20 alpha=1.0 progress=false'"
    )
    cmd = [
        "flwr",
        "run",
        ".",
        "--stream",
        "--run-config",
        run_config,
        "--federation-config",
        "num-supernodes=4 client-resources-num-cpus=1",
    ]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    finally:
        stop_local_superlink(env)
    local = sim([*SMALL, "backend=serial", f"output_dir={tmp_path / 'local'}"], tmp_path)
    assert local.returncode == 0, local.stderr[-3000:]
    assert metrics(out) == metrics(tmp_path / "local")
    ran, alive = new_actor_nodes(cluster, before)
    assert ran == alive, (ran, alive)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_bad_ray_address_fails_in_seconds_with_one_line(tmp_path):
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    proc = sim([*SMALL, "backend=ray", f"ray.address=127.0.0.1:{port}", f"output_dir={tmp_path}"], tmp_path, timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 2 and took < 20, (proc.returncode, took)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [
        f"pflower: ray.address=127.0.0.1:{port}: no Ray head answers there (Connection refused); start one "
        f"with `ray start --head --port {port}` on that machine, or fix the address"
    ], proc.stderr
    assert not any(tmp_path.glob("*/*"))
