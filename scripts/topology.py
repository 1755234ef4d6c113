#!/usr/bin/env python3
"""One description of a pflower deployment, two renderings: docker compose and real local processes.

``docker/topology.yaml`` says what the federation is (a SuperLink with TLS and SuperNode
authentication, a ServerApp SuperExec, N SuperNodes with their own data and state). This
module turns it into command lines for a :class:`Placement` (where certificates, data and
state live, and which addresses to use):

- :data:`COMPOSE` places everything in containers: ``docker/compose.yaml`` is
  :func:`render_compose` of it (``python scripts/topology.py compose --write``; a unit test
  checks the committed file is up to date);
- tests/e2e builds a placement of temporary directories and free loopback ports (or
  network-namespace addresses) and starts :func:`services` as real processes.

Both therefore run the same ``flower-superlink`` / ``flower-superexec`` /
``pflower-supernode`` (or ``flower-supernode``) command lines. ``--insecure`` is only produced for
``Placement(local_insecure=True)``, which refuses any non-loopback address.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TOPOLOGY = ROOT / "docker" / "topology.yaml"
COMPOSE_FILE = ROOT / "docker" / "compose.yaml"
COMPOSE_GPU_FILE = ROOT / "docker" / "compose.gpu.yaml"
COMPOSE_ENV_FILE = ROOT / "docker" / ".env"
ENV = {
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",  # never `uv sync` app dependencies at run time
    # a SuperExec (the ServerApp's, and the one each SuperNode starts for its ClientApps) looks for
    # new work every second by default: up to 1 s idle per message, twice a round
    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.5",
}


LAUNCHERS = ("flower-supernode", "pflower-supernode")


@dataclass(frozen=True)
class Topology:
    name: str
    port: int
    supernode_auth: bool
    serverapp_isolation: str
    superexec_auth: bool
    nodes: int
    node_isolation: str
    gpu: bool
    data_overrides: tuple[str, ...]
    run: Mapping[str, Any]
    launcher: str = "flower-supernode"  # or pflower-supernode: Flower's, with a short poll while messages are due
    heartbeat_interval: float | None = None  # s, pflower-supernode only; None: Flower's 30 s
    steady_poll: bool = False  # pflower-supernode only: Flower's 3 s poll always (nodes sharing one host's cores)

    def run_config(self, output_dir: str | None = None, **extra: Any) -> str:
        """The ``--run-config`` string of ``flwr run . <name>`` (num_clients = the node count)."""
        values: dict[str, Any] = {**self.run, "num_clients": self.nodes, **extra}
        if output_dir is not None:
            values["output_dir"] = output_dir
        return " ".join(f"{k}={_toml_value(v)}" for k, v in values.items())


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if "'" in text:
        raise ValueError(f"run-config value {text!r} must not contain a single quote")
    return f"'{text}'"


def load(path: str | Path = DEFAULT_TOPOLOGY) -> Topology:
    raw = yaml.safe_load(Path(path).read_text())
    link, nodes = raw["superlink"], raw["supernodes"]
    topo = Topology(
        name=str(raw["name"]),
        port=int(link["port"]),
        supernode_auth=bool(link.get("supernode_auth", True)),
        serverapp_isolation=str(link.get("serverapp_isolation", "process")),
        superexec_auth=bool(link.get("superexec_auth", True)),
        nodes=int(nodes["count"]),
        node_isolation=str(nodes.get("isolation", "subprocess")),
        gpu=bool(nodes.get("gpu", False)),
        data_overrides=tuple(raw.get("data", {}).get("overrides", [])),
        run=dict(raw.get("run", {})),
        launcher=str(nodes.get("launcher", "flower-supernode")),
        heartbeat_interval=None if nodes.get("heartbeat_interval") is None else float(nodes["heartbeat_interval"]),
        steady_poll=bool(nodes.get("steady_poll", False)),
    )
    if topo.nodes < 1:
        raise ValueError("supernodes.count must be >= 1")
    if topo.launcher not in LAUNCHERS:
        raise ValueError(f"supernodes.launcher {topo.launcher!r}: give one of {', '.join(LAUNCHERS)}")
    for key, value in (("heartbeat_interval", topo.heartbeat_interval), ("steady_poll", topo.steady_poll or None)):
        if value is not None and topo.launcher != "pflower-supernode":
            raise ValueError(f"supernodes.{key} needs launcher: pflower-supernode (flower-supernode has no such flag)")
    if topo.serverapp_isolation not in ("process", "subprocess") or topo.node_isolation not in (
        "process",
        "subprocess",
    ):
        raise ValueError("isolation must be 'process' or 'subprocess'")
    return topo


@dataclass(frozen=True)
class Placement:
    """Where one rendering puts things: paths as the processes see them, and addresses."""

    certs: str  # ca.crt, server.pem, server.key, superexec.secret, nodes/node-<i>.key|.pub
    superlink_bind: str  # flower-superlink --host
    superlink_address: str  # how SuperNodes, the SuperExec and the flwr CLI reach it (host, no port)
    port: int
    database: str
    python: str  # interpreter for scripts/federation.py
    scripts: str  # the scripts/ directory
    node_data: Callable[[int], str]
    node_state: Callable[[int], str]
    node_runtime_port: Callable[[int], int] = lambda i: 9094
    local_insecure: bool = False  # the explicitly named local mode: no TLS, no node auth, loopback only
    output_dir: str | None = None

    def __post_init__(self) -> None:
        if self.local_insecure:
            for host in (self.superlink_bind, self.superlink_address):
                if not _is_loopback(host):
                    raise ValueError(f"local insecure mode only binds/connects to loopback, not {host!r}")

    def cert(self, name: str) -> str:
        return f"{self.certs.rstrip('/')}/{name}"

    def node_key(self, i: int, ext: str = "key") -> str:
        return self.cert(f"nodes/node-{i}.{ext}")

    @property
    def link(self) -> str:
        host = self.superlink_address
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class Service:
    """One process (one compose service)."""

    name: str
    role: str  # superlink | serverapp | register | supernode
    argv: list[str]
    env: dict[str, str] = field(default_factory=lambda: dict(ENV))
    client_id: int | None = None


def superlink_argv(topo: Topology, place: Placement) -> list[str]:
    argv = ["flower-superlink"]
    if place.local_insecure:
        argv += ["--insecure"]
    else:
        argv += [
            "--ssl-ca-certfile",
            place.cert("ca.crt"),
            "--ssl-certfile",
            place.cert("server.pem"),
            "--ssl-keyfile",
            place.cert("server.key"),
        ]
        if topo.supernode_auth:
            argv += ["--enable-supernode-auth"]
    argv += ["--isolation", topo.serverapp_isolation]
    if topo.serverapp_isolation == "process" and topo.superexec_auth and not place.local_insecure:
        argv += ["--superexec-auth-secret-file", place.cert("superexec.secret")]
    argv += [
        "--host",
        place.superlink_bind,
        "--port",
        str(place.port),
        "--database",
        place.database,
        "--disable-runtime-dependency-installation",
    ]
    return argv


def superexec_argv(topo: Topology, place: Placement) -> list[str]:
    """The ServerApp's SuperExec (process isolation): it launches flwr-serverapp for each run."""
    argv = ["flower-superexec", "--runtime-api-address", place.link]
    if place.local_insecure:
        return argv + ["--insecure"]
    argv += ["--root-certificates", place.cert("ca.crt")]
    if topo.superexec_auth:
        argv += ["--superexec-auth-secret-file", place.cert("superexec.secret")]
    return argv


def node_config(place: Placement, i: int, extra: Mapping[str, Any] | None = None) -> str:
    """``--node-config`` of SuperNode i: its client id, its own data and state directories."""
    values: dict[str, Any] = {
        "client-id": i,
        "data-dir": place.node_data(i),
        "state-dir": place.node_state(i),
        **(extra or {}),
    }
    return " ".join(f"{k}={json.dumps(v) if isinstance(v, str) else _toml_value(v)}" for k, v in values.items())


def supernode_argv(
    topo: Topology, place: Placement, i: int, extra_node_config: Mapping[str, Any] | None = None
) -> list[str]:
    argv = [topo.launcher, "--superlink", place.link]
    if topo.heartbeat_interval is not None:
        argv += ["--heartbeat-interval", f"{topo.heartbeat_interval:g}"]
    if topo.steady_poll:
        argv += ["--steady-poll"]
    if place.local_insecure:
        argv += ["--insecure"]
    else:
        argv += ["--root-certificates", place.cert("ca.crt")]
        if topo.supernode_auth:
            argv += ["--auth-supernode-private-key", place.node_key(i)]
    argv += [
        "--node-config",
        node_config(place, i, extra_node_config),
        "--isolation",
        topo.node_isolation,
        "--port",
        str(place.node_runtime_port(i)),
    ]
    return argv


def clientapp_superexec_argv(topo: Topology, place: Placement, i: int) -> list[str]:
    """Node i's ClientApp SuperExec (``isolation: process``): ``pflower-superexec`` forks every
    ClientApp from a process that imported torch once, instead of a fresh process per message.
    It shares the SuperNode's network namespace and talks to its Runtime API on loopback, as
    the SuperExec a SuperNode starts itself in ``subprocess`` mode does (no TLS, no SuperExec
    auth: the Runtime API listens on 127.0.0.1 only)."""
    return ["pflower-superexec", "--runtime-api-address", f"127.0.0.1:{place.node_runtime_port(i)}", "--insecure"]


def register_argv(topo: Topology, place: Placement) -> list[str]:
    """Write the flwr connection and register every node's public key (idempotent)."""
    argv = [place.python, f"{place.scripts.rstrip('/')}/federation.py", "register", topo.name, "--address", place.link]
    argv += ["--root-certificates", place.cert("ca.crt")]
    return argv + [place.node_key(i, "pub") for i in range(topo.nodes)]


def services(topo: Topology, place: Placement) -> list[Service]:
    """Every process of the deployment, in start order."""
    out = [Service("superlink", "superlink", superlink_argv(topo, place))]
    if topo.serverapp_isolation == "process":
        out.append(Service("serverapp", "serverapp", superexec_argv(topo, place)))
    if topo.supernode_auth and not place.local_insecure:
        out.append(Service("register", "register", register_argv(topo, place)))
    for i in range(topo.nodes):
        out.append(Service(f"supernode-{i}", "supernode", supernode_argv(topo, place, i), client_id=i))
        if topo.node_isolation == "process":
            out.append(Service(f"clientapp-{i}", "clientapp", clientapp_superexec_argv(topo, place, i), client_id=i))
    return out


# ----------------------------------------------------------------------------- docker compose

COMPOSE = Placement(
    certs="/certs",
    superlink_bind="0.0.0.0",
    superlink_address="superlink",
    port=0,  # replaced by the topology's port
    database="/state/superlink.db",
    python="python",
    scripts="/opt/pflower/scripts",
    node_data=lambda i: "/data",
    node_state=lambda i: "/state",
)

# Host-side settings of the compose file, each with the default a user gets. A test (or a second
# demo beside the first) sets them to use its own directory, port and images.
BUILD_ARGS = {
    "BASE": "${PFLOWER_BASE:-python:3.11-slim}",  # docker/Dockerfile; an offline base: scripts/docker_offline.py
    "TORCH": "${PFLOWER_TORCH:-torch torchvision}",
}
DEMO_DIR = "${PFLOWER_DEMO_DIR:-.}"  # certs/, data/, outputs/ (relative paths: next to compose.yaml)
HOST_PORT = "${PFLOWER_PORT:-%d}"  # the SuperLink's port published on the host
USER = "${PFLOWER_UID:-1000}:${PFLOWER_GID:-1000}"  # who the processes run as: must read the mounted keys
COMPOSE_ENV = {"FLWR_HOME": "/tmp/flwr"}  # flwr's own files, writable whatever the user


HEADER = """\
# GENERATED from docker/topology.yaml by `python scripts/topology.py compose --write`.
# Do not edit by hand: edit topology.yaml and regenerate (a test compares the two).
# Before `docker compose up`, create the TLS material and the node data (docker/README.md):
#   python scripts/gen_certs.py --out docker/certs --nodes {nodes}
#   python scripts/export_partitions.py --out docker/data num_clients={nodes} {data}
"""


def _placement_for_compose(topo: Topology) -> Placement:
    return replace(COMPOSE, port=topo.port)


def compose_dict(topo: Topology) -> dict[str, Any]:
    place = _placement_for_compose(topo)

    # every service names its image and how to build it (the builder's cache builds each once),
    # so `docker compose up --build` never tries to pull these local images. Both images come
    # from one Dockerfile and share all but their last layers.
    def image(target: str) -> dict[str, Any]:
        return {
            "image": f"{topo.name}-{target}:latest",
            "build": {"context": "..", "dockerfile": "docker/Dockerfile", "target": target, "args": dict(BUILD_ARGS)},
        }

    server_image, edge_image = image("server"), image("edge")
    svc: dict[str, Any] = {}
    health = (
        "import httpx; httpx.get('https://localhost:%d/health', verify='/certs/ca.crt').raise_for_status()" % topo.port
    )
    for s in services(topo, place):
        if s.role == "superlink":
            svc[s.name] = {
                **server_image,
                "command": s.argv,
                "user": USER,
                "environment": {**s.env, **COMPOSE_ENV},
                "ports": [f"{HOST_PORT % topo.port}:{topo.port}"],
                "volumes": [  # only what the SuperLink needs: never the CA key or node private keys
                    *[
                        f"{DEMO_DIR}/certs/{f}:/certs/{f}:ro"
                        for f in ("ca.crt", "server.pem", "server.key", "superexec.secret")
                    ],
                    "superlink-state:/state",
                ],
                "healthcheck": {
                    "test": ["CMD", "python", "-c", health],
                    "interval": "5s",
                    "timeout": "5s",
                    "retries": 12,
                },
                "restart": "unless-stopped",
            }
        elif s.role == "serverapp":
            svc[s.name] = {
                **server_image,
                "command": s.argv,
                "user": USER,
                "environment": {**s.env, **COMPOSE_ENV},
                "working_dir": "/outputs",
                "volumes": [
                    f"{DEMO_DIR}/certs/ca.crt:/certs/ca.crt:ro",
                    f"{DEMO_DIR}/certs/superexec.secret:/certs/superexec.secret:ro",
                    f"{DEMO_DIR}/outputs:/outputs",
                ],
                "depends_on": {"superlink": {"condition": "service_healthy"}},
                "restart": "unless-stopped",
            }
        elif s.role == "register":
            svc[s.name] = {
                **server_image,
                "command": s.argv,
                "user": USER,
                "environment": {**s.env, **COMPOSE_ENV},
                "volumes": [  # public keys only
                    f"{DEMO_DIR}/certs/ca.crt:/certs/ca.crt:ro",
                    *[f"{DEMO_DIR}/certs/nodes/node-{i}.pub:/certs/nodes/node-{i}.pub:ro" for i in range(topo.nodes)],
                ],
                "depends_on": {"superlink": {"condition": "service_healthy"}},
                "restart": "no",
            }
        elif s.role == "clientapp":  # in its SuperNode's network namespace: the Runtime API is on loopback
            svc[s.name] = {
                **edge_image,
                "command": s.argv,
                "user": USER,
                "environment": {**s.env, **COMPOSE_ENV},
                "network_mode": f"service:supernode-{s.client_id}",
                "volumes": [
                    f"{DEMO_DIR}/data/client_{s.client_id}:/data:ro",
                    f"supernode-{s.client_id}-state:/state",
                ],  # the ClientApps read and write here
                "depends_on": {f"supernode-{s.client_id}": {"condition": "service_started"}},
                "restart": "unless-stopped",
            }
        else:
            i = s.client_id
            after = "register" if any(x.role == "register" for x in services(topo, place)) else "superlink"
            cond = "service_completed_successfully" if after == "register" else "service_healthy"
            svc[s.name] = {
                **edge_image,
                "command": s.argv,
                "user": USER,
                "environment": {**s.env, **COMPOSE_ENV},
                "volumes": [
                    f"{DEMO_DIR}/certs/ca.crt:/certs/ca.crt:ro",
                    f"{DEMO_DIR}/certs/nodes/node-{i}.key:/certs/nodes/node-{i}.key:ro",
                    f"{DEMO_DIR}/data/client_{i}:/data:ro",
                    f"{s.name}-state:/state",
                ],
                "depends_on": {after: {"condition": cond}},
                "restart": "unless-stopped",
            }
    volumes = {"superlink-state": {}, **{f"supernode-{i}-state": {} for i in range(topo.nodes)}}
    # no top-level `name:` (docker-compose 1.29 refuses it): the project name is in docker/.env
    return {"services": svc, "volumes": volumes}


def compose_gpu_dict(topo: Topology) -> dict[str, Any]:
    gpu = {
        "deploy": {
            "resources": {"reservations": {"devices": [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}}
        }
    }
    runs_clientapps = "clientapp" if topo.node_isolation == "process" else "supernode"  # where the ClientApps run
    return {"services": {f"{runs_clientapps}-{i}": gpu for i in range(topo.nodes)}}


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # repeated blocks written out, no &anchors
        return True


def _dump(data: dict[str, Any]) -> str:
    return yaml.dump(data, Dumper=_NoAliases, sort_keys=False, default_flow_style=False, width=200)


def render_compose(topo: Topology) -> str:
    return HEADER.format(nodes=topo.nodes, data=" ".join(topo.data_overrides)) + _dump(compose_dict(topo))


def render_compose_gpu(topo: Topology) -> str:
    head = (
        "# GENERATED from docker/topology.yaml (scripts/topology.py compose --write). GPU override:\n"
        "#   docker compose -f docker/compose.yaml -f docker/compose.gpu.yaml up\n"
        "# needs the NVIDIA Container Toolkit on the host; without a GPU, use compose.yaml alone.\n"
    )
    return head + _dump(compose_gpu_dict(topo)) if topo.gpu else head


def _default(setting: str) -> str:
    """``${VAR:-default}`` -> ``default``."""
    return setting.split(":-", 1)[1].rstrip("}")


def render_env(topo: Topology) -> str:
    """docker/.env: read by `docker compose` v2 and docker-compose 1.29 from compose.yaml's directory;
    a variable set in the shell wins over this file."""
    return (
        "# GENERATED from docker/topology.yaml (scripts/topology.py compose --write).\n"
        f"COMPOSE_PROJECT_NAME={topo.name}\n"
        "# Host-side settings of compose.yaml, with their defaults (set them here or in the shell):\n"
        + "".join(
            f"# {line}\n"
            for line in (
                f"PFLOWER_BASE={_default(BUILD_ARGS['BASE'])}        # base image; offline: "
                "local/debian-py311:bookworm "
                "(scripts/docker_offline.py base)",
                f"PFLOWER_TORCH={_default(BUILD_ARGS['TORCH'])}      # torch requirement(s) of the images; "
                "offline CPU: "
                "torch==2.13.0+cpu, say",
                "PFLOWER_DEMO_DIR=.                   # where certs/, data/ and outputs/ are",
                f"PFLOWER_PORT={topo.port}                    # the SuperLink port published on the host",
                "PFLOWER_UID=1000                     # the user the services run as: the owner of the key files",
                "PFLOWER_GID=1000",
            )
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render docker/topology.yaml")
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser(
        "compose", help="print docker/compose.yaml (--write: write it and compose.gpu.yaml; --check: exit 1 if stale)"
    )
    c.add_argument("--topology", default=str(DEFAULT_TOPOLOGY))
    g = c.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true")
    g.add_argument("--check", action="store_true")
    r = sub.add_parser("run-config", help="print the --run-config of the demo run")
    r.add_argument("--topology", default=str(DEFAULT_TOPOLOGY))
    r.add_argument("--output-dir", default=None)
    p = sub.add_parser("commands", help="print every process's command line (compose placement)")
    p.add_argument("--topology", default=str(DEFAULT_TOPOLOGY))
    args = parser.parse_args(argv)
    topo = load(args.topology)
    if args.cmd == "run-config":
        print(topo.run_config(args.output_dir))
        return 0
    if args.cmd == "commands":
        for s in services(topo, _placement_for_compose(topo)):
            print(f"# {s.name}\n{shlex.join(s.argv)}")
        return 0
    files = {
        COMPOSE_FILE: render_compose(topo),
        COMPOSE_GPU_FILE: render_compose_gpu(topo),
        COMPOSE_ENV_FILE: render_env(topo),
    }
    if args.check:
        stale = [str(p) for p, text in files.items() if not p.exists() or p.read_text() != text]
        if stale:
            print(f"stale: {stale}; run `python scripts/topology.py compose --write`", file=sys.stderr)
            return 1
        return 0
    if args.write:
        for path, text in files.items():
            path.write_text(text)
            print(f"wrote {path}")
        return 0
    sys.stdout.write(files[COMPOSE_FILE])
    return 0


if __name__ == "__main__":
    sys.exit(main())
