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

from integration.test_simulation import without_timings

BIN = Path(sys.executable).parent
SMALL = ["num_clients=4", "rounds=2", "local_epochs=1", "fraction=1.0", "partition.min_size=20", "alpha=1.0",
         "method=fedper", "progress=false"]

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(out: Path) -> list[dict]:
    (run,) = [p for p in out.glob("*/*") if p.is_dir()]
    return [without_timings(json.loads(x)) for x in (run / "metrics.jsonl").read_text().splitlines()]


def sim(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "pflower"), "sim", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_a_run_joins_a_two_node_ray_cluster_and_writes_the_local_numbers(tmp_path, monkeypatch):
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    # Ray rewrites 127.0.0.1 in an address to this machine's outward IP (to reach a cluster of
    # several machines); with its "no multi-machine clusters" switch it keeps loopback, so the
    # whole cluster, this process and the pflower run stay on 127.0.0.1
    monkeypatch.setenv(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "0")
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)

    # a short directory: Ray's unix sockets live under it (the path limit is 107 bytes)
    ray_tmp = Path(tempfile.mkdtemp(prefix="prc", dir="/tmp"))
    port = free_port()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "gcs_server_port": port, "include_dashboard": False, "temp_dir": str(ray_tmp),
        "node_ip_address": "127.0.0.1",
    })
    pids: list[int] = []
    try:
        worker = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        pids = [p.process.pid for node in (cluster.head_node, worker) for ps in node.all_processes.values() for p in ps]
        address = f"127.0.0.1:{port}"
        assert cluster.address.endswith(f":{port}")
        env = {**os.environ, "RAY_ADDRESS": ""}  # only the key may point the run at the cluster
        joined = sim([*SMALL, "backend=ray", f"ray.address={address}", f"output_dir={tmp_path / 'cluster'}"], tmp_path, env)
        assert joined.returncode == 0, joined.stdout[-3000:] + joined.stderr[-3000:]
        local = sim([*SMALL, "backend=serial", f"output_dir={tmp_path / 'local'}"], tmp_path)
        assert local.returncode == 0, local.stderr[-3000:]
        assert metrics(tmp_path / "cluster") == metrics(tmp_path / "local")

        # which nodes ran ClientApp actors: the cluster's actor table (GCS; dead actors stay listed)
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        try:
            actors = [a for a in ray._private.state.actors().values() if "ClientAppActor" in a["ActorClassName"]]
            nodes = {a["Address"]["NodeID"] for a in actors}
            alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        finally:
            ray.shutdown()
        assert len(alive) == 2 and nodes == alive, (nodes, alive)
    finally:
        cluster.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.5)
    assert not [p for p in pids if _alive(p)], "a Ray process of the test's cluster outlived it"


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
    assert lines == [f"pflower: ray.address=127.0.0.1:{port}: no Ray head answers there (Connection refused); start one "
                     f"with `ray start --head --port {port}` on that machine, or fix the address"], proc.stderr
    assert not any(tmp_path.glob("*/*"))
