"""Deployment tooling without processes: topology -> compose, certificates, connections, the fault hook."""

import importlib.util
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def script(name):
    mod_name = f"pflower_scripts_{name}"
    if mod_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(mod_name, ROOT / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
    return sys.modules[mod_name]


topology = script("topology")


def local_placement(tmp, **kw):
    return topology.Placement(
        certs=str(tmp / "certs"),
        superlink_bind="127.0.0.1",
        superlink_address="127.0.0.1",
        port=40001,
        database=str(tmp / "db"),
        python=sys.executable,
        scripts=str(ROOT / "scripts"),
        node_data=lambda i: str(tmp / f"data{i}"),
        node_state=lambda i: str(tmp / f"state{i}"),
        node_runtime_port=lambda i: 41000 + i,
        **kw,
    )


def test_committed_compose_files_are_generated_from_the_topology():
    topo = topology.load()
    assert topology.COMPOSE_FILE.read_text() == topology.render_compose(topo), (
        "docker/compose.yaml is stale: run `python scripts/topology.py compose --write`"
    )
    assert topology.COMPOSE_GPU_FILE.read_text() == topology.render_compose_gpu(topo)
    assert topology.main(["compose", "--check"]) == 0


def test_e2e_processes_and_compose_services_come_from_the_same_description(tmp_path):
    """Same services, same flags in the same order; only paths, hosts and ports differ."""
    import yaml

    topo = topology.load()
    compose = yaml.safe_load(topology.COMPOSE_FILE.read_text())["services"]
    local = topology.services(topo, local_placement(tmp_path))
    assert [s.name for s in local] == list(compose)

    def flags(argv):
        return [a for a in argv if a.startswith("--")]

    for svc in local:
        assert flags(svc.argv) == flags(compose[svc.name]["command"]), svc.name
        assert _program(svc.argv[0]) == _program(compose[svc.name]["command"][0])
        assert {k: str(v) for k, v in compose[svc.name]["environment"].items() if k != "FLWR_HOME"} == svc.env
    supernodes = [s for s in local if s.role == "supernode"]
    assert [s.client_id for s in supernodes] == list(range(topo.nodes))


def test_tls_and_node_auth_everywhere_insecure_only_in_the_named_local_mode(tmp_path):
    topo = topology.load()
    for svc in topology.services(topo, topology._placement_for_compose(topo)):
        assert "--insecure" not in svc.argv
    link = topology.superlink_argv(topo, local_placement(tmp_path))
    assert "--enable-supernode-auth" in link and "--ssl-certfile" in link
    insecure = topology.services(topo, local_placement(tmp_path, local_insecure=True))
    assert all("--insecure" in s.argv for s in insecure if s.role != "register")
    assert "register" not in [s.role for s in insecure]
    with pytest.raises(ValueError, match="loopback"):
        replace(local_placement(tmp_path), superlink_bind="0.0.0.0", local_insecure=True)


def test_process_isolation_gives_every_node_its_own_warm_superexec(tmp_path):
    """supernodes.isolation: process: a pflower-superexec beside each SuperNode, on that node's
    loopback Runtime API (compose: in the SuperNode's network namespace, with its data and state,
    and the GPU where the ClientApps run); TLS and auth everywhere else are unchanged."""
    topo = replace(topology.load(), node_isolation="process")
    local = topology.services(topo, local_placement(tmp_path))
    names = [s.name for s in local]
    for i in range(topo.nodes):
        assert names.index(f"clientapp-{i}") == names.index(f"supernode-{i}") + 1
        node = next(s for s in local if s.name == f"supernode-{i}")
        app = next(s for s in local if s.name == f"clientapp-{i}")
        assert (
            node.argv[node.argv.index("--isolation") + 1] == "process" and "--host" not in node.argv
        )  # Runtime API on 127.0.0.1
        assert app.argv == ["pflower-superexec", "--runtime-api-address", f"127.0.0.1:{41000 + i}", "--insecure"]
    compose = topology.compose_dict(topo)["services"]
    app = compose["clientapp-1"]
    assert app["network_mode"] == "service:supernode-1" and app["image"] == compose["supernode-1"]["image"]
    assert app["volumes"] == ["${PFLOWER_DEMO_DIR:-.}/data/client_1:/data:ro", "supernode-1-state:/state"]
    assert [n for n, svc in compose.items() if "--insecure" in svc["command"]] == [
        f"clientapp-{i}" for i in range(topo.nodes)
    ]
    assert set(topology.compose_gpu_dict(topo)["services"]) == {f"clientapp-{i}" for i in range(topo.nodes)}
    assert set(topology.compose_gpu_dict(topology.load())["services"]) == {f"supernode-{i}" for i in range(topo.nodes)}


def test_run_and_node_configs_parse_as_flower_reads_them(tmp_path):
    from flwr.common.config import parse_config_args

    topo = topology.load()
    run = parse_config_args([topo.run_config("/out dir")])
    assert run["num_clients"] == topo.nodes and run["method"] == "fedcmd" and run["dataset"] == "local"
    assert run["output_dir"] == "/out dir"
    node = parse_config_args([topology.node_config(local_placement(tmp_path), 2, {"test-fault": "nan"})])
    assert node == {
        "client-id": 2,
        "data-dir": str(tmp_path / "data2"),
        "state-dir": str(tmp_path / "state2"),
        "test-fault": "nan",
    }


def test_demo_certificates_and_node_keys_are_what_flower_loads(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key
    from flwr.cli.supernode.register import try_load_public_key

    gen = script("gen_certs")
    paths = gen.generate(tmp_path, nodes=2, sans=["10.1.2.3", "link.example.org"])
    ca = x509.load_pem_x509_certificate(paths["ca"].read_bytes())
    server = x509.load_pem_x509_certificate(paths["server_cert"].read_bytes())
    ca.public_key().verify(server.signature, server.tbs_certificate_bytes, ec.ECDSA(server.signature_hash_algorithm))
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = {str(v) for v in sans.get_values_for_type(x509.DNSName)} | {
        str(v) for v in sans.get_values_for_type(x509.IPAddress)
    }
    assert {"localhost", "127.0.0.1", "superlink", "10.1.2.3", "link.example.org"} <= names
    for i in range(2):
        key = load_ssh_private_key(paths[f"node-{i}.key"].read_bytes(), None)  # as flower-supernode does
        assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
        assert try_load_public_key(paths[f"node-{i}.pub"])  # as `flwr supernode register` does
        assert os.stat(paths[f"node-{i}.key"]).st_mode & 0o077 == 0
    assert os.stat(paths["server_key"]).st_mode & 0o077 == 0
    with pytest.raises(FileExistsError):
        gen.generate(tmp_path, nodes=1)


def test_connection_is_written_where_flwr_reads_it(tmp_path, monkeypatch):
    from flwr.cli.flower_config import read_superlink_connection

    fed = script("federation")
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    (tmp_path / "ca.crt").write_text("x")
    fed.write_connection("pflower", "127.0.0.1:9093", str(tmp_path / "ca.crt"))
    conn = read_superlink_connection("pflower")
    assert conn.address == "127.0.0.1:9093" and conn.root_certificates == str(tmp_path / "ca.crt")
    assert read_superlink_connection(None).name == "local"  # Flower's default connection is kept
    fed.write_connection("local-insecure", "127.0.0.1:9093", local_insecure=True)
    assert read_superlink_connection("local-insecure").insecure
    with pytest.raises(SystemExit, match="loopback"):
        fed.write_connection("x", "192.0.2.10:9093", local_insecure=True)
    with pytest.raises(SystemExit, match="root-certificates"):
        fed.write_connection("x", "192.0.2.10:9093")


@pytest.mark.parametrize(
    "fault, round_, match",
    [
        ("shape", 1, "has shape"),
        ("nan", 1, "NaN"),
        ("count", 1, "does not match"),
        ("shape,nan,count", 2, "NaN"),
        ("shape,nan,count", 6, "does not match"),
    ],
)
def test_the_fault_hook_produces_replies_the_server_rejects(fault, round_, match):
    from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

    from pflower.client_app.runtime import _tamper
    from pflower.strategies.base.validation import InvalidReply, validate_reply

    tensors = {"w": np.ones((3, 4), np.float32), "b": np.zeros(3, np.float32)}
    metrics = {"client-id": 0, "num-examples": 50, "test_size": 10}
    _tamper(fault, round_, metrics, tensors)
    content = RecordDict(
        {
            "arrays": ArrayRecord(array_dict={k: Array(v) for k, v in tensors.items()}),
            "metrics": MetricRecord(metrics),
        }
    )
    expected = {"w": ((3, 4), np.dtype(np.float32)), "b": ((3,), np.dtype(np.float32))}
    with pytest.raises(InvalidReply, match=match):
        validate_reply(
            content,
            node_id=1,
            expected_client=0,
            expected_arrays=expected,
            expected_train_size=50,
            expected_test_size=10,
        )


def test_the_slow_fault_holds_a_valid_reply_back(monkeypatch):
    from pflower.client_app import runtime

    slept = []
    monkeypatch.setattr(runtime.time, "sleep", slept.append)
    tensors = {"w": np.ones((3, 4), np.float32)}
    metrics = {"client-id": 0, "num-examples": 50, "test_size": 10}
    runtime._tamper("slow:12.5", 1, metrics, tensors)
    assert slept == [12.5]
    assert metrics["num-examples"] == 50 and np.array_equal(tensors["w"], np.ones((3, 4), np.float32))
    with pytest.raises(ValueError, match="slow:<seconds>"):
        runtime._tamper("late", 1, metrics, tensors)


def _dockerfile_sources() -> list[str]:
    text = (ROOT / "docker" / "Dockerfile").read_text()
    return [s for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M) for s in line.split()[:-1]]


def _docker_context_keeps(path: str) -> bool:
    """Whether the root .dockerignore (an allowlist after `**`) sends ``path`` to the builder."""
    rules = [
        r.strip() for r in (ROOT / ".dockerignore").read_text().splitlines() if r.strip() and not r.startswith("#")
    ]
    assert rules[0] == "**", "the .dockerignore starts by excluding everything"
    top = path.rstrip("/").split("/")
    return any(
        r.startswith("!") and r[1:].rstrip("/").split("/") == top[: len(r[1:].rstrip("/").split("/"))] for r in rules
    )


def test_dockerfile_copies_only_what_exists_and_the_context_sends_it_and_compose_builds_it():
    import yaml

    sources = _dockerfile_sources()
    assert sources and all((ROOT / s).exists() for s in sources), sources
    assert all(_docker_context_keeps(s) for s in sources), [s for s in sources if not _docker_context_keeps(s)]
    for never in (".venv", "docker/certs", "docker/data", "docker/outputs", "docs/results", "tests"):
        assert not _docker_context_keeps(never), never
    compose = yaml.safe_load(topology.COMPOSE_FILE.read_text())
    targets = set(re.findall(r"^FROM \S+ AS (\w+)$", (ROOT / "docker" / "Dockerfile").read_text(), re.M))
    for name, svc in compose["services"].items():
        build = svc["build"]
        assert (ROOT / "docker" / build["context"] / build["dockerfile"]).exists(), name
        assert build["target"] in targets and svc["image"].endswith(f"-{build['target']}:latest"), name
        assert set(build["args"]) == {"BASE", "TORCH"}, name


def test_the_images_copy_every_package_the_installed_code_imports():
    """`pip install .` in an image installs what was copied; a package the copied code imports
    but the Dockerfile leaves out breaks the image (it happened: protocol/ after base v2)."""
    import ast
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"pflower", *setuptools["package-dir"].values()}  # where the installed packages come from
    copied = {s.rstrip("/") for s in _dockerfile_sources()}
    assert folders <= copied, ("pyproject packages not copied", folders - copied)
    for pkg in folders:
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else ([node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
                )
                for module in names:
                    top = module.removeprefix("pflower.").split(".")[0]
                    assert not (ROOT / top / "__init__.py").exists() or top in copied, (str(path), module)


def test_image_requirements_are_the_project_dependencies_without_torch():
    import tomllib

    reqs = script("image_requirements").requirements(ROOT / "pyproject.toml")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [d for d in deps if not d.startswith(("torch>", "torchvision>", "torch=", "torchvision="))] == reqs
    assert not any(r.split(">")[0].split("=")[0].strip() in ("torch", "torchvision") for r in reqs)


def test_offline_base_reads_the_mirror_apt_uses(tmp_path):
    offline = script("docker_offline")
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
    )
    assert offline.debian_mirror((str(deb822),)) == "http://mirror.example/debian"
    legacy = tmp_path / "sources.list"
    legacy.write_text(
        "deb http://security.example/debian-security bookworm-security main\ndeb [arch=amd64] http://m.example/debian/ "
        "bookworm main\n"
    )
    assert offline.debian_mirror((str(legacy),)) == "http://m.example/debian"
    assert offline.debian_mirror((str(tmp_path / "missing"),)) == offline.DEFAULT_MIRROR


def test_offline_wheels_are_wheels_only_the_host_builds_source_packages(tmp_path, monkeypatch):
    """fill_wheels downloads with the host's pip and turns a source-only package (hydra's antlr4
    runtime) into a wheel there, so the image build needs no build backend or index."""
    import subprocess

    offline = script("docker_offline")
    (tmp_path / "stale-0.1-py3-none-any.whl").write_text("from an earlier set")
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        if cmd[1] == "wheel":
            assert kwargs["env"]["SOURCE_DATE_EPOCH"] == offline.WHEEL_BUILD_EPOCH
        if "download" in cmd:
            (tmp_path / "pkg-1.0.tar.gz").write_text("sdist")
            (tmp_path / "dep-1.0-py3-none-any.whl").write_text("wheel")
        elif "wheel" in cmd:
            (tmp_path / "pkg-1.0-py3-none-any.whl").write_text("built")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(offline.subprocess, "run", fake_run)
    wheels = offline.fill_wheels("torch==1.0+cpu", dest=tmp_path, pip=("pip",))
    assert [w.name for w in wheels] == ["dep-1.0-py3-none-any.whl", "pkg-1.0-py3-none-any.whl"]
    assert not (tmp_path / "pkg-1.0.tar.gz").exists()
    assert "torch==1.0+cpu" in calls[0] and "flwr[simulation]>=1.42,<1.43" in calls[0] and "setuptools>=69" in calls[0]
    assert calls[1][:2] == ["pip", "wheel"] and calls[1][-1].endswith("pkg-1.0.tar.gz")
    assert offline.wheels_are_for("torch==1.0+cpu", tmp_path) and not offline.wheels_are_for("torch", tmp_path)


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_a_wheel_built_from_source_has_the_same_bytes_every_time(tmp_path):
    """Docker's build cache keys the COPY of docker/buildenv/ on the files' bytes: a wheel that
    differed on every build (its zip entries dated when it was built) rebuilt the 2 GB virtual
    environment layer on every fresh clone and left the old one behind (53 GB in a day)."""
    import hashlib
    import tarfile
    import time

    offline = script("docker_offline")
    src = tmp_path / "tinypkg-1.0"
    (src / "tinypkg").mkdir(parents=True)
    (src / "tinypkg" / "__init__.py").write_text("X = 1\n")
    (src / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='tinypkg', version='1.0', packages=['tinypkg'])\n"
    )
    (src / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n")
    sdist = tmp_path / "tinypkg-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    digests = []
    for attempt in ("a", "b"):
        out = tmp_path / attempt
        offline.build_wheel(sdist, out, pip=(sys.executable, "-m", "pip", "--disable-pip-version-check"))
        (wheel,) = out.glob("*.whl")
        digests.append(hashlib.sha256(wheel.read_bytes()).hexdigest())
        time.sleep(2.1)  # a zip entry's time has a two-second resolution
    assert digests[0] == digests[1]


def _program(path: str) -> str:
    """``/venv/bin/python3.11`` and ``python`` are the same program (a venv's pytest runs python3)."""
    return re.sub(r"[\d.]+$", "", path.rsplit("/", 1)[-1])


def test_the_supernode_launcher_and_its_heartbeat_come_from_the_topology(tmp_path):
    topo = topology.load()
    node = topology.supernode_argv(topo, local_placement(tmp_path), 0)
    assert node[0] == "pflower-supernode" and node[node.index("--heartbeat-interval") + 1] == "10"
    assert "--steady-poll" in node  # every node of the demo shares one host's cores
    flowers = topology.supernode_argv(
        replace(topo, launcher="flower-supernode", heartbeat_interval=None, steady_poll=False),
        local_placement(tmp_path),
        0,
    )
    assert flowers[0] == "flower-supernode" and "--heartbeat-interval" not in flowers and "--steady-poll" not in flowers
    text = topology.DEFAULT_TOPOLOGY.read_text()
    bad = tmp_path / "topology.yaml"
    bad.write_text(text.replace("launcher: pflower-supernode", "launcher: flower-supernode"))
    with pytest.raises(ValueError, match="heartbeat_interval needs launcher: pflower-supernode"):
        topology.load(bad)
    bad.write_text(text.replace("launcher: pflower-supernode", "launcher: supernode"))
    with pytest.raises(ValueError, match="supernodes.launcher 'supernode': give one of"):
        topology.load(bad)
