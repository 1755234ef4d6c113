"""End-to-end: the docker-compose demo (docker/compose.yaml), built and run for real.

The images are built from docker/Dockerfile the offline way (docker/README.md, "Offline build"):
a Debian base made with debootstrap (or PFLOWER_BASE, or python:3.11-slim where it is already
here), and every wheel downloaded by the host's pip into docker/buildenv/wheels (the containers
reach no index). Then the committed compose file, unchanged, starts the demo under a project
name of its own, with this test's directory for certificates, data and outputs and a free host
port: SuperLink with TLS and node authentication, the ServerApp SuperExec, the registration
job and three SuperNodes, each with its own data directory and state volume. `flwr run` from
the host runs the topology's demo job; SuperNode 1 is restarted (`compose restart`) once it has
replied in round 3. Everything the project made (containers, networks, volumes) is removed
afterwards; the images stay, as the build cache of the next run, and the pflower images that
this build superseded are removed (each rebuild after a code change leaves one set behind:
about 2.2 GB, 53 GB over a day of runs before this was done).

Skipped, with the reason, where no Docker engine answers or no compose is installed
(.ci/run installs and starts one where it can).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from e2e_cluster import BIN, ROOT, client_rounds, free_port, load_script, wait_for

pytestmark = pytest.mark.slow

topology = load_script("topology")
offline = load_script("docker_offline")

OFFLINE_BASE = offline.DEFAULT_TAG
ROUNDS = 7
RESTART_AFTER_ROUND = 3  # a model trained three rounds: its restored layers stand clear of the untrained level
ROUND_TIMEOUT = 60  # s; a node restarted in the middle of a round is waited for at most this long
RUN_DEADLINE = 600  # s for `flwr run`


def _ok(cmd: list[str], timeout: float = 30) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def compose_command() -> list[str] | None:
    """Compose v2 (`docker compose`) where present, else docker-compose 1.29."""
    if _ok(["docker", "compose", "version"]):
        return ["docker", "compose"]
    if shutil.which("docker-compose") and _ok(["docker-compose", "version"]):
        return ["docker-compose"]
    return None


def pick_base() -> str:
    """PFLOWER_BASE, else the offline Debian base (made here if it is missing and can be), else
    python:3.11-slim if the engine has it or can pull it."""
    if os.environ.get("PFLOWER_BASE"):
        return os.environ["PFLOWER_BASE"]
    if _ok(["docker", "image", "inspect", OFFLINE_BASE]):
        return OFFLINE_BASE
    if _ok(["docker", "image", "inspect", "python:3.11-slim"]) or _ok(
        ["docker", "pull", "python:3.11-slim"], timeout=120
    ):
        return "python:3.11-slim"
    try:
        return offline.make_base(OFFLINE_BASE)
    except (offline.OfflineError, subprocess.CalledProcessError) as err:
        pytest.skip(f"no base image: Docker Hub is unreachable and the offline base could not be made ({err})")


def cpu_torch_on_disk() -> str | None:
    """``torch==<v>+cpu`` when a CPU wheel of torch lies in one of pip's find-links directories
    (a few hundred MB instead of PyPI's CUDA-bundling wheels, which are several GB)."""
    links = os.environ.get("PIP_FIND_LINKS", "")
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True
    )
    dirs = [d for d in (links + " " + (out.stdout if out.returncode == 0 else "")).split() if Path(d).is_dir()]
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for d in dirs:
        for wheel in sorted(Path(d).glob(f"torch-*+cpu-{tag}-*.whl"), reverse=True):
            return f"torch=={wheel.name.split('-')[1]}"
    return None


def ensure_wheels(torch: str) -> None:
    """docker/buildenv/wheels holds this torch spec's set (downloaded once, then reused: the same
    files a user's `docker_offline.py wheels` makes, so the two share the build cache)."""
    if not offline.wheels_are_for(torch):
        offline.fill_wheels(torch)


class Demo:
    """One compose project of docker/compose.yaml with its own directory, port and name."""

    def __init__(self, tmp: Path, compose: list[str]) -> None:
        self.tmp = tmp
        self.topo = topology.load()
        self.project = f"pflowere2e{secrets.token_hex(3)}"
        self.port = free_port()
        self.flwr_home = tmp / "flwr"
        self.env = {
            **os.environ,
            "PFLOWER_DEMO_DIR": str(tmp),
            "PFLOWER_PORT": str(self.port),
            "PFLOWER_UID": str(os.getuid()),
            "PFLOWER_GID": str(os.getgid()),
            "FLWR_HOME": str(self.flwr_home),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        }
        self.compose = [*compose, "-p", self.project, "-f", str(topology.COMPOSE_FILE)]

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run([*self.compose, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
            )
        return out

    def logs(self, service: str) -> str:
        out = self.run("logs", "--no-color", service, check=False, timeout=60)
        return out.stdout + out.stderr

    def prepare(self) -> None:
        py = sys.executable
        n = self.topo.nodes
        subprocess.run(
            [py, str(ROOT / "scripts/gen_certs.py"), "--out", str(self.tmp / "certs"), "--nodes", str(n)],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                py,
                str(ROOT / "scripts/export_partitions.py"),
                "--out",
                str(self.tmp / "data"),
                f"num_clients={n}",
                *self.topo.data_overrides,
            ],
            check=True,
            capture_output=True,
        )
        (self.tmp / "outputs").mkdir()
        (self.tmp / "outputs").chmod(0o777)  # the ServerApp's user writes here

    def resources(self) -> dict[str, list[str]]:
        """What the engine holds of this project (compose labels every container, network and volume)."""
        label = f"label=com.docker.compose.project={self.project}"
        found = {}
        for kind in ("container", "network", "volume"):
            args = ["docker", kind, "ls", "-q", "--filter", label] + (["-a"] if kind == "container" else [])
            found[kind] = subprocess.run(args, capture_output=True, text=True).stdout.split()
        return found

    def flwr_run(self, run_config: str) -> subprocess.Popen:
        log = open(self.tmp / "flwr-run.log", "w")
        return subprocess.Popen(
            [str(BIN / "python"), "-m", "pflower.server_app.flwr_cli", "run", ".", self.project, "--stream"]
            + ["--run-config", run_config],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def run_dir(self) -> Path | None:
        dirs = sorted((self.tmp / "outputs").glob("*/*-fedcmd-*"))
        return dirs[-1] if dirs else None

    def rounds(self) -> list[dict]:
        run = self.run_dir()
        if run is None or not (run / "metrics.jsonl").exists():
            return []
        return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    if not _ok(["docker", "info"]):
        pytest.skip("no Docker engine answers `docker info` (Debian: apt-get install docker.io, then start dockerd)")
    compose = compose_command()
    if compose is None:
        pytest.skip(
            "neither `docker compose` (v2) nor docker-compose (Debian: apt-get install docker-compose) is installed"
        )
    timings: dict[str, float | int | str] = {}
    t0 = time.monotonic()
    base = pick_base()
    torch = os.environ.get("PFLOWER_TORCH") or cpu_torch_on_disk() or offline.DEFAULT_TORCH
    ensure_wheels(torch)
    timings["base_and_wheels_s"] = round(time.monotonic() - t0, 1)
    d = Demo(tmp_path_factory.mktemp("compose"), compose)
    d.env.update(PFLOWER_BASE=base, PFLOWER_TORCH=torch)
    timings.update(base=base, torch=torch, compose=" ".join(compose))
    try:
        t = time.monotonic()
        offline.tag_deps(base, torch)  # so that the prune below keeps the next build's cache
        d.run("build", timeout=1800)
        timings["build_s"] = round(time.monotonic() - t, 1)
        timings["pruned"] = offline.prune_superseded()
        d.prepare()
        t = time.monotonic()
        d.run("up", "-d", timeout=300)
        for i in range(d.topo.nodes):
            wait_for(
                lambda i=i: "SuperNode ID:" in d.logs(f"supernode-{i}") or None,
                180,
                f"supernode-{i} to be accepted",
                interval=2,
            )
        timings["up_s"] = round(time.monotonic() - t, 1)
        # from the host: a TLS connection to the published port, then the topology's demo job
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "scripts/federation.py"),
                "connection",
                d.project,
                "--address",
                f"127.0.0.1:{d.port}",
                "--root-certificates",
                str(d.tmp / "certs/ca.crt"),
            ],
            env=d.env,
            check=True,
            capture_output=True,
        )
        config = d.topo.run_config(
            output_dir="/outputs", rounds=ROUNDS, overrides=f"method.kp=1 round_timeout={ROUND_TIMEOUT}"
        )
        t_run = time.monotonic()
        run = d.flwr_run(config)
        deadline = t_run + RUN_DEADLINE
        # restart SuperNode 1 once it has replied in round RESTART_AFTER_ROUND
        wait_for(
            lambda: RESTART_AFTER_ROUND in client_rounds(d.logs("supernode-1")) or run.poll() is not None,
            RUN_DEADLINE,
            f"supernode-1's round-{RESTART_AFTER_ROUND} reply",
            interval=2,
        )
        assert run.poll() is None, (d.tmp / "flwr-run.log").read_text()[-4000:]
        before_restart = client_rounds(d.logs("supernode-1"))
        t = time.monotonic()
        d.run("restart", "supernode-1", timeout=120)
        timings["restart_s"] = round(time.monotonic() - t, 1)
        run.wait(timeout=max(1.0, deadline - time.monotonic()))
        timings["run_s"] = round(time.monotonic() - t_run, 1)
        logs = {i: d.logs(f"supernode-{i}") for i in range(d.topo.nodes)}
        print("\n[compose e2e timings]", json.dumps(timings, indent=1))
        (d.tmp / "timings.json").write_text(json.dumps(timings, indent=1))
        yield {"demo": d, "run": run, "logs": logs, "before_restart": before_restart, "timings": timings}
    finally:
        d.run("down", "-v", "--remove-orphans", "-t", "5", timeout=300, check=False)


def test_the_demo_job_finishes_over_tls_with_node_auth(demo):
    d, run = demo["demo"], demo["run"]
    log = (d.tmp / "flwr-run.log").read_text()
    assert run.returncode == 0, log[-4000:]
    rounds = d.rounds()
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1)), rounds
    summary = json.loads((d.run_dir() / "summary.json").read_text())
    assert summary["method"] == "fedcmd" and summary["dataset"] == "local" and summary["num_clients"] == d.topo.nodes
    assert summary["final_clients"] == d.topo.nodes  # the restarted node evaluates at the end too
    assert (d.run_dir() / "accuracy.png").stat().st_size > 1000
    link = d.logs("superlink")
    assert "Uvicorn running on https://" in link and "SuperNode authentication is disabled" not in link


def test_each_node_trained_on_its_own_data(demo):
    d, logs = demo["demo"], demo["logs"]
    for i in range(d.topo.nodes):
        with np.load(d.tmp / "data" / f"client_{i}" / "test.npz") as z:
            own_test = len(z[next(iter(z.files))])
        lines = client_rounds(logs[i])
        assert lines, logs[i][-3000:]
        assert {v["client"] for v in lines.values()} == {i}
        sizes = {int(n) for n in re.findall(rf"client {i} round \d+: .*?\((\d+) test samples\)", logs[i])}
        assert sizes == {own_test}, (i, sizes, own_test)
    # and the server accepted replies from these nodes only
    assert all(set(r["clients"]) <= set(range(d.topo.nodes)) for r in d.rounds())


def test_no_superseded_pflower_image_is_left_behind(demo):
    out = subprocess.run(
        ["docker", "images", "-q", "--filter", "dangling=true", "--filter", f"label={offline.IMAGE_LABEL}"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == [], out.stdout
    for tag in ("pflower-server:latest", "pflower-edge:latest", offline.DEPS_TAG):
        assert _ok(["docker", "image", "inspect", tag]), tag


def test_a_restarted_supernode_keeps_its_personalization(demo):
    d, before = demo["demo"], demo["before_restart"]
    after = client_rounds(demo["logs"][1])
    later = [r for r in after if r > max(before)]
    assert later, f"supernode-1 never replied after its restart: {sorted(after)}"
    first = after[min(later)]
    # it read its personal layers back from its state volume, and evaluates with them: far above
    # the untrained model it started round 1 with, close to where it was before the restart
    untrained = before[1]["test_before"]
    assert first["restored"] > 0, first
    assert first["test_before"] >= untrained + 0.2, (untrained, first, before)
    assert first["test_before"] >= 0.75 * before[max(before)]["test_after"], (before, first)
    assert any(1 in r["clients"] for r in d.rounds() if r["round"] >= min(later))


def test_teardown_leaves_nothing_of_the_project_behind(demo):
    d = demo["demo"]
    d.run("down", "-v", "--remove-orphans", "-t", "5", timeout=300)
    assert d.resources() == {"container": [], "network": [], "volume": []}
