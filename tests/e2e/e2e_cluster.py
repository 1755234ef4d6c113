"""Real Flower processes for the e2e tests, laid out from docker/topology.yaml.

A :class:`Cluster` gets its processes from ``scripts/topology.py`` (the same command lines
docker/compose.yaml is generated from), placed in a temporary directory with free loopback
ports, or with the SuperNodes in network namespaces of their own (:class:`NetNS`). Every
process runs in its own session, so stopping it stops its SuperExec and ClientApp children
too; :meth:`Cluster.close` stops all of them, sweeps up any child that escaped (found by this
cluster's unique ports) and removes the namespaces.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def load_script(name: str) -> Any:
    """Import scripts/<name>.py (scripts/ is not a package)."""
    mod_name = f"pflower_scripts_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    return module


topology = load_script("topology")
gen_certs = load_script("gen_certs")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


class NetNS:
    """A bridge in this namespace plus one network namespace (own address) per SuperNode."""

    def __init__(self, nodes: int) -> None:
        self.tag = secrets.token_hex(2)
        used = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
        for _ in range(50):
            net = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250)}"
            if f"{net}." not in used:
                break
        self.net = net
        self.bridge = f"pfl{self.tag}br"
        self.gateway = f"{net}.1"  # the SuperLink's address, on the bridge
        self.nodes = nodes
        self.created: list[tuple[str, str]] = []

    def ns(self, i: int) -> str:
        return f"pfl{self.tag}n{i}"

    def host_link(self, i: int) -> str:
        return f"pfl{self.tag}h{i}"

    def address(self, i: int) -> str:
        return f"{self.net}.{10 + i}"

    def setup(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self.created.append(("link", self.bridge))
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(self.nodes):
            ns, host, peer = self.ns(i), self.host_link(i), f"pfl{self.tag}p{i}"
            _ip("netns", "add", ns)
            self.created.append(("netns", ns))
            _ip("link", "add", host, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", ns)
            _ip("-n", ns, "link", "set", peer, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "set", host, "master", self.bridge)
            _ip("link", "set", host, "up")

    def cut(self, i: int) -> None:
        """Pull node i's cable: its link goes down, nothing reaches the SuperLink any more."""
        _ip("link", "set", self.host_link(i), "down")

    def restore(self, i: int) -> None:
        _ip("link", "set", self.host_link(i), "up")

    def prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(i)]

    def teardown(self) -> None:
        for kind, name in self.created:  # first every process still inside our namespaces
            if kind == "netns":
                pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
        for kind, name in reversed(self.created):
            args = ["netns", "del", name] if kind == "netns" else ["link", "del", name]
            subprocess.run(["ip", *args], capture_output=True, timeout=20)
        self.created.clear()

    @staticmethod
    def available() -> str | None:
        """None when namespaces can be created here, else why not."""
        if os.geteuid() != 0:
            return "network namespaces need root"
        if shutil.which("ip") is None:
            return "network namespaces need iproute2 (`ip`)"
        probe = f"pflprobe{secrets.token_hex(2)}"
        try:
            _ip("netns", "add", probe)
            _ip("link", "add", f"{probe}b", "type", "bridge")
        except (OSError, subprocess.CalledProcessError) as exc:
            return f"cannot create network namespaces here: {getattr(exc, 'stderr', exc)}"
        finally:
            subprocess.run(["ip", "link", "del", f"{probe}b"], capture_output=True)
            subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        return None


class Proc:
    """One started process (its own session) and its log file."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log: Path, cwd: Path) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.log_handle = open(log, "ab")
        self.started = time.monotonic()
        self.popen = subprocess.Popen(
            argv, env=dict(env), cwd=cwd, stdout=self.log_handle, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace: float = 5.0) -> None:
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        self.signal(signal.SIGKILL)  # also children left in the session
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self.log_handle.close()


class Cluster:
    """A SuperLink, its ServerApp SuperExec and SuperNodes, as real processes (TLS and node auth on)."""

    def __init__(
        self,
        tmp: Path,
        nodes: int,
        *,
        extra_keys: int = 0,
        netns: NetNS | None = None,
        node_config: Mapping[int, Mapping[str, Any]] | None = None,
        isolation: str | None = None,
        shared_superexec: bool = False,
    ) -> None:
        self.tmp = Path(tmp)
        self.topo = replace(topology.load(), nodes=nodes)
        if isolation is not None:  # "process": every node gets its own pflower-superexec (warm ClientApps)
            self.topo = replace(self.topo, node_isolation=isolation)
        # one pflower-superexec (named clientapp-0) serving every node's Runtime API, as on a host
        # running several SuperNodes; loopback only (a network namespace per node has its own)
        assert not (shared_superexec and netns), "a shared SuperExec reaches its nodes on one host's loopback"
        self.shared_superexec = shared_superexec
        self.netns = netns
        host = netns.gateway if netns else "127.0.0.1"
        self.runtime_ports = {i: (9094 if netns else free_port()) for i in range(nodes + extra_keys)}
        self.place = topology.Placement(
            certs=str(self.tmp / "certs"),
            superlink_bind=host,
            superlink_address=host,
            port=free_port(host if not netns else "127.0.0.1"),
            database=str(self.tmp / "superlink.db"),
            python=sys.executable,
            scripts=str(ROOT / "scripts"),
            node_data=lambda i: str(self.tmp / "data" / f"client_{i}"),
            node_state=lambda i: str(self.tmp / "state" / f"node-{i}"),
            node_runtime_port=lambda i: self.runtime_ports[i],
            output_dir=str(self.tmp / "outputs"),
        )
        self.extra_keys = extra_keys
        self.node_config = dict(node_config or {})
        self.extra_env: dict[str, str] = {}  # set last in every process's environment (benchmarks)
        self.procs: dict[str, Proc] = {}
        self.all_procs: list[Proc] = []
        (self.tmp / "logs").mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ environment
    def env(self, home: str, **extra: str) -> dict[str, str]:
        env = {**os.environ, **topology.ENV, "PYTHONUNBUFFERED": "1", "FLWR_HOME": str(self.tmp / "flwr" / home)}
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
        env.update(self.extra_env)
        env.update(extra)
        return env

    def log_path(self, name: str) -> Path:
        path = self.tmp / "logs" / f"{name}.log"
        n = 1
        while path.exists():
            n += 1
            path = self.tmp / "logs" / f"{name}.{n}.log"
        return path

    # ------------------------------------------------------------------ lifecycle
    def prepare(self, data_overrides: list[str]) -> None:
        """Demo TLS material (SANs include the SuperLink's address) and one data directory per node."""
        from pflower.federated_data.export import export_partitions
        from pflower.server_app.run_plan import plan_run

        sans = [self.place.superlink_address]
        gen_certs.generate(self.tmp / "certs", self.topo.nodes + self.extra_keys, sans)
        export_partitions(plan_run([f"num_clients={self.topo.nodes}", *data_overrides]).data, self.tmp / "data")

    def start(self, name: str, argv: list[str], home: str, netns_index: int | None = None) -> Proc:
        prefix = self.netns.prefix(netns_index) if (self.netns and netns_index is not None) else []
        proc = Proc(name, prefix + argv, self.env(home), self.log_path(name), ROOT)
        self.procs[name] = proc
        self.all_procs.append(proc)
        return proc

    def up(self, timeout: float = 90.0) -> None:
        """Start every service of the topology in order; waits for the SuperLink and the registration."""
        for svc in topology.services(self.topo, self.place):
            if svc.role == "register":
                proc = subprocess.run(
                    svc.argv, env=self.env("cli"), capture_output=True, text=True, timeout=timeout, cwd=ROOT
                )
                assert proc.returncode == 0, f"registration failed:\n{proc.stdout}\n{proc.stderr}"
                self.registration = proc.stdout
            elif svc.role == "supernode":
                self.start_node(svc.client_id)
            elif svc.role == "clientapp" and self.shared_superexec:
                if svc.client_id == 0:  # every node's Runtime API, comma-separated: one task loop each
                    ports = ",".join(f"127.0.0.1:{self.runtime_ports[i]}" for i in range(self.topo.nodes))
                    argv = list(svc.argv)
                    argv[argv.index("--runtime-api-address") + 1] = ports
                    self.start(svc.name, argv, "clientapps")
            elif svc.role == "clientapp":  # the node's own SuperExec, in its namespace, with its FLWR_HOME
                self.start(svc.name, svc.argv, f"supernode-{svc.client_id}", netns_index=svc.client_id)
            else:
                self.start(svc.name, svc.argv, svc.name)
                if svc.role == "superlink":
                    self.wait_healthy(timeout)

    def node_argv(self, i: int, key_index: int | None = None, **extra: Any) -> list[str]:
        argv = topology.supernode_argv(self.topo, self.place, i, {**self.node_config.get(i, {}), **extra})
        if key_index is not None:  # a SuperNode holding another key pair (e.g. one never registered)
            argv[argv.index("--auth-supernode-private-key") + 1] = self.place.node_key(key_index)
            argv[argv.index("--port") + 1] = str(self.runtime_ports[key_index])
        return argv

    def start_node(self, i: int) -> Proc:
        return self.start(f"supernode-{i}", self.node_argv(i), f"supernode-{i}", netns_index=i)

    def node_id(self, i: int) -> int:
        """SuperNode ``i``'s node id, from its log."""
        found = re.search(r"SuperNode ID: (\d+)", self.procs[f"supernode-{i}"].text())
        assert found, f"supernode-{i} has not logged its node id"
        return int(found.group(1))

    def node_status(self, i: int) -> str:
        """What the SuperLink says of SuperNode ``i`` now (``online``, ``offline``, ...), from
        `flwr supernode ls`: the same online test (a heartbeat within its patience) as the
        node list a ServerApp samples from."""
        proc = subprocess.run(
            [str(BIN / "flwr"), "supernode", "ls", self.topo.name, "--format", "json"],
            env=self.env("cli"),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        try:
            nodes = json.loads(proc.stdout[proc.stdout.index("{") :])["nodes"]
        except (ValueError, KeyError):
            raise AssertionError(f"flwr supernode ls: unexpected output\n{proc.stdout}{proc.stderr}") from None
        wanted = str(self.node_id(i))
        return next((n["status"] for n in nodes if n["node-id"] == wanted), "unknown")

    def kill_node(self, i: int) -> None:
        """SIGKILL the SuperNode and its SuperExec/ClientApp children: a device that dies."""
        for name in (f"supernode-{i}", f"clientapp-{i}"):
            if name in self.procs:
                self.procs[name].signal(signal.SIGKILL)
                self.procs[name].popen.wait(10)

    def wait_healthy(self, timeout: float) -> None:
        import httpx

        url = f"https://{self.place.link}/health"
        ca = self.place.cert("ca.crt")

        def ok() -> bool:
            if not self.procs["superlink"].alive():
                raise RuntimeError(f"SuperLink exited:\n{self.procs['superlink'].text()[-3000:]}")
            try:
                return httpx.get(url, verify=ca, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ok, timeout, f"SuperLink health at {url}")

    def flwr_run(self, run_config: str | None, log_name: str = "flwr-run", app: Path = ROOT) -> Proc:
        """`flwr run . <name> --stream` from the repository (or another Flower ``app``: its own
        run-config defaults where ``run_config`` is None), through a connection with TLS."""
        env = self.env("cli")
        conn = self.topo.name
        # registration already wrote the connection into this FLWR_HOME (scripts/federation.py)
        flwr = [str(BIN / "python"), "-m", "pflower.server_app.flwr_cli"]  # `flwr`, not walking .venv (5.8 s)
        cmd = [*flwr, "run", ".", conn, "--stream", *(["--run-config", run_config] if run_config else [])]
        proc = Proc(log_name, cmd, env, self.log_path(log_name), app)
        self.procs[log_name] = proc
        self.all_procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in reversed(self.all_procs):
            proc.stop()
        self._sweep()
        if self.netns is not None:
            self.netns.teardown()

    def _sweep(self) -> None:
        """Stop any process that still talks to this cluster's ports (a child that left our sessions)."""
        marks = [f":{self.place.port}"] + [f"127.0.0.1:{p}" for p in self.runtime_ports.values() if not self.netns]
        mine = os.getpid()
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                pid = int(cmdline.parent.name)
                args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, ValueError):
                continue
            if pid != mine and ("flower-" in args or "flwr-" in args) and any(m + " " in args + " " for m in marks):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    # ------------------------------------------------------------------ results
    def run_dir(self, method: str = "fedcmd") -> Path | None:
        dirs = sorted((self.tmp / "outputs").glob(f"*/*-{method}-*"))
        return dirs[-1] if dirs else None

    def rounds(self, method: str = "fedcmd") -> list[dict[str, Any]]:
        run = self.run_dir(method)
        if run is None or not (run / "metrics.jsonl").exists():
            return []
        lines = (run / "metrics.jsonl").read_text().splitlines()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line being written
                break
        return out


CLIENT_LINE = re.compile(
    r"client (\d+) round (\d+): test_before ([\d.]+) test_after ([\d.]+) \((\d+) test samples\), (\d+) state tensors "
    r"restored"
)


def client_rounds(text: str) -> dict[int, dict[str, float]]:
    """Per round, what a SuperNode's ClientApp logged (client_app/runtime.py's one line per round)."""
    out = {}
    for m in CLIENT_LINE.finditer(text):
        out[int(m.group(2))] = {
            "client": int(m.group(1)),
            "test_before": float(m.group(3)),
            "test_after": float(m.group(4)),
            "restored": int(m.group(6)),
        }
    return out


def train_messages_received(text: str) -> int:
    """The training rounds a SuperNode has been sent so far: its train messages, less the first,
    which is the discovery (ClientDirectory.query asks as a train message)."""
    return max(0, text.count("Receiving: train message") - 1)
