"""What a deployed node's ClientApp process sets up once: threads, the partition cache, its timings;
and the ServerApp's reply polling."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import pflower.client_app.node as node
import pflower.client_app.runtime as runtime
from pflower.client_app.runtime import client_data
from pflower.federated_data import DataSpec, load_client_data
from pflower.federated_data.node_cache import cache_dir, cache_path
from pflower.strategies.base.messaging import REPLY_POLL_S, send_and_receive

SPEC = DataSpec(dataset="digits", num_clients=3, alpha=1.0, min_size=20)


# ----------------------------------------------------------------------------- threads


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_node_config_sets_the_threads_and_rejects_a_bad_value(restore_threads):
    assert node.torch_threads({"client-id": 0, "torch-threads": 3}) == 3
    assert node.torch_threads({"partition-id": 0, "torch-threads": "2"}) == 2  # explicit wins in simulation too
    assert node.apply_threads({"client-id": 0, "torch-threads": 2}) == 2 == torch.get_num_threads()
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(ValueError, match=r"torch-threads=.* is not a positive integer.*--node-config"):
            node.torch_threads({"client-id": 0, "torch-threads": bad})


def test_nodes_sharing_a_host_split_its_cores_and_a_lone_node_keeps_the_default(monkeypatch):
    monkeypatch.setattr(node, "usable_cores", lambda: 16)
    monkeypatch.setattr(node, "supernodes_on_host", lambda: 3)
    assert node.torch_threads({"client-id": 0}) == 5
    monkeypatch.setattr(node, "supernodes_on_host", lambda: 40)
    assert node.torch_threads({"client-id": 0}) == 1
    monkeypatch.setattr(node, "supernodes_on_host", lambda: 1)
    assert node.torch_threads({"client-id": 0}) is None
    monkeypatch.setattr(node, "supernodes_on_host", lambda: 3)
    assert node.torch_threads({"partition-id": 0}) is None  # simulation: the engine decides


def test_supernodes_on_the_host_are_counted_from_their_command_lines(tmp_path):
    lines = {
        "101": b"/venv/bin/flower-supernode\0--insecure\0",
        "102": b"/usr/bin/python3\0/venv/bin/flower-supernode\0--node-config\0client-id=1\0",
        "103": b"/usr/bin/python3\0flwr-clientapp\0",
        "104": b"/usr/bin/python3\0-c\0print('flower-supernode')\0",
        "self": b"flower-supernode\0",  # not a pid
    }
    for pid, cmdline in lines.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "cmdline").write_bytes(cmdline)
    assert node.supernodes_on_host(tmp_path) == 2
    assert node.supernodes_on_host(tmp_path / "101") == 1  # none found: still one (this node)


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_a_process_reports_its_age_once():
    code = (
        "import time; time.sleep(0.4); import client_app.node as n; "
        "a = n.cold_start_s(); b = n.cold_start_s(); print(a, b)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert float(out[0]) >= 0.4 and out[1] == "None"


# ----------------------------------------------------------------------------- partition cache


def test_a_deployed_node_caches_its_partition_and_a_fresh_process_loads_it(tmp_path, monkeypatch):
    config = {"client-id": 1, "cache-dir": str(tmp_path)}
    spec = {"data": SPEC.to_dict()}
    first = client_data(spec, 1, config)
    path = cache_path(tmp_path, SPEC.to_dict(), 1)
    assert path.exists()
    # a fresh process: no in-memory caches, and building the partition is not allowed
    runtime._node_cached_data.cache_clear()
    monkeypatch.setattr(runtime, "load_client_data", lambda *a: pytest.fail("rebuilt instead of read from the cache"))
    again = client_data(spec, 1, config)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(first, name), getattr(again, name)), name
        assert torch.equal(getattr(first, name), getattr(load_client_data(SPEC, 1), name)), name
    # another split, another file: a changed alpha never reads the old partition
    other = DataSpec(dataset="digits", num_clients=3, alpha=0.5, min_size=20)
    assert cache_path(tmp_path, other.to_dict(), 1) != path and cache_path(tmp_path, SPEC.to_dict(), 2) != path


def test_an_unreadable_cache_file_is_rebuilt_with_a_warning(tmp_path, caplog):
    config = {"client-id": 0, "cache-dir": str(tmp_path)}
    path = cache_path(tmp_path, SPEC.to_dict(), 0)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not an npz")
    runtime._node_cached_data.cache_clear()
    with caplog.at_level(logging.WARNING):
        data = client_data({"data": SPEC.to_dict()}, 0, config)
    assert "unreadable" in caplog.text and "rebuilding" in caplog.text
    assert torch.equal(data.x_train, load_client_data(SPEC, 0).x_train)
    with np.load(path) as z:  # rewritten whole
        assert np.array_equal(z["y_test"], load_client_data(SPEC, 0).y_test.numpy())


def test_the_cache_is_off_in_simulation_with_none_and_never_fails_a_round(tmp_path, caplog):
    runtime._node_cached_data.cache_clear()
    spec = {"data": SPEC.to_dict()}
    client_data(spec, 0, {"partition-id": 0, "cache-dir": str(tmp_path)})  # simulation
    client_data(spec, 0, {"client-id": 0, "cache-dir": "none"})
    assert not (tmp_path / "partitions").exists()
    assert cache_dir({"client-id": 0, "cache-dir": "off"}) is None
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache directory should be")
    with caplog.at_level(logging.WARNING):
        data = client_data(spec, 2, {"client-id": 2, "cache-dir": str(blocked)})
    assert "cannot write the partition cache" in caplog.text and data.num_train > 0


def test_default_cache_directory_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir({"client-id": 0}) == tmp_path / "pflower"


# ----------------------------------------------------------------------------- timings in a reply


def test_a_deployed_nodes_reply_and_log_carry_its_timings(compose, tiny_overrides, caplog, monkeypatch):
    from pflower.server_app.runner import build
    from pflower.simulation.inprocess import InProcessGrid

    monkeypatch.setattr(node, "_first_message_seen", False)
    cfg = compose(*tiny_overrides, "method=fedavg", "rounds=1", "fraction=1.0")
    strategy = build(cfg, "tok")
    grid = InProcessGrid(4, node_config={})
    for ctx in grid.contexts.values():  # what a user's SuperNode has: a client id, no partition id
        ctx.node_config["client-id"] = ctx.node_config.pop("partition-id")
        ctx.node_config.pop("num-partitions")
    with caplog.at_level(logging.INFO):
        strategy.start(grid=grid, initial_arrays=None, num_rounds=1, timeout=60)
    replies = [r for r in grid.replies if r.metadata.message_type == "train"]
    metrics = [dict(next(iter(r.content.metric_records.values()))) for r in replies]
    assert all(m["setup_time_s"] > 0 for m in metrics)
    assert sum("cold_start_s" in m for m in metrics) == 1  # one process here: only its first message is cold
    record = strategy.run.history[-1]
    assert record["client_setup_s"] > 0 and record["client_cold_start_s"] > 0
    assert "cold start" in caplog.text and "setup" in caplog.text


def test_node_config_device_overrides_the_run_s_and_is_checked(compose, tiny_overrides, monkeypatch):
    assert node.node_device({}, "auto") == "auto" and node.node_device({"device": "cpu"}, "cuda") == "cpu"
    with pytest.raises(ValueError, match="is not a torch device: use cpu, cuda or cuda:<index>"):
        node.node_device({"device": "gpu1"}, "auto")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert node.node_device({"device": "cuda:1"}, "auto") == "cuda:1"  # a SuperNode pinned to the second GPU
    with pytest.raises(ValueError, match=r"sees 2 CUDA device\(s\): pick one of \['cpu', 'cuda:0', 'cuda:1'\]"):
        node.node_device({"device": "cuda:2"}, "auto")
    monkeypatch.undo()
    # a run that asks for CUDA trains on the CPU of the nodes that say so (this machine has no CUDA)
    from pflower.server_app.runner import build
    from pflower.simulation.inprocess import InProcessGrid

    strategy = build(compose(*tiny_overrides, "method=fedavg", "rounds=1", "fraction=1.0", "device=cuda"), "tok")
    strategy.start(grid=InProcessGrid(4, node_config={"device": "cpu"}), initial_arrays=None, num_rounds=1, timeout=60)
    assert strategy.run.history[-1]["clients"] == [0, 1, 2, 3]


# ----------------------------------------------------------------------------- reply polling


class SlowGrid:
    """A grid whose replies arrive ``delay`` seconds after the push."""

    def __init__(self, delay: float) -> None:
        self.delay, self.pulls = delay, 0

    def push_messages(self, messages):
        self.t0, self.ids = time.monotonic(), [f"m{i}" for i, _ in enumerate(messages)]
        return list(self.ids)

    def pull_messages(self, ids):
        self.pulls += 1
        if time.monotonic() - self.t0 < self.delay:
            return []
        return [type("Reply", (), {"metadata": type("Meta", (), {"reply_to_message_id": i})()})() for i in ids]


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_replies_are_collected_within_a_poll_of_their_arrival(serverapp_identity):
    from flwr.app import Message, RecordDict

    def messages(n):
        return [Message(RecordDict(), dst_node_id=i + 1, message_type="train") for i in range(n)]

    grid = SlowGrid(0.3)
    t0 = time.monotonic()
    replies = send_and_receive(grid, messages(2), timeout=30)
    waited = time.monotonic() - t0
    assert len(replies) == 2 and waited < 0.3 + 2 * REPLY_POLL_S + 0.5  # Flower's own loop: 3 s
    assert send_and_receive(SlowGrid(10), messages(1), timeout=0.3) == []


def test_a_grid_that_only_answers_synchronously_keeps_its_own_loop():
    class Sync:
        def push_messages(self, messages):
            raise NotImplementedError

        def send_and_receive(self, messages, *, timeout=None):
            return ["reply"] * len(list(messages))

    assert send_and_receive(Sync(), [1, 2], timeout=5) == ["reply", "reply"]


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_deterministic_mode_reaches_the_client_and_keeps_the_numbers_on_cpu(compose, tiny_overrides):
    """deterministic=true asks torch for deterministic kernels in the client's process; on CPU
    pflower's kernels already are, so the run's numbers do not change."""
    import json
    import subprocess

    code = (
        "import json, sys, torch\n"
        "from simulation.simulate import simulate\n"
        "from server_app.run_plan import plan_run\n"
        "s = simulate(plan_run(sys.argv[2:]))\n"
        "print(json.dumps({'det': torch.are_deterministic_algorithms_enabled(), 'acc': "
        "s['headline_test_before_acc']}))\n"
    )
    from pflower.simulation.simulate import simulate

    common = [*tiny_overrides, "method=fedavg", "backend=serial"]
    args = [*common, "deterministic=true", f"output_dir={compose().run.output_dir}/det"]
    proc = subprocess.run([sys.executable, "-c", code, "x", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    det = json.loads(proc.stdout.strip().splitlines()[-1])
    plain = simulate(compose(*common))  # in this process: the default leaves torch's mode alone
    assert det["det"] is True and not torch.are_deterministic_algorithms_enabled()
    assert det["acc"] == plain["headline_test_before_acc"]


def _report_forked(queue) -> None:  # runs in a fork server's child
    from pflower.client_app.node import forked_from_fork_server

    queue.put(forked_from_fork_server())


@pytest.mark.heavy  # over 1 s of one core: not in the quick tier
def test_a_clientapp_knows_it_is_a_fork_of_the_fork_server():
    """What the e2e test of warm ClientApps reads (issue 76, 7): the event itself (forked from a
    process that imported torch), not a timing that a loaded machine skews."""
    import multiprocessing

    from pflower.client_app.node import forked_from_fork_server

    ctx = multiprocessing.get_context("forkserver")
    queue = ctx.Queue()
    child = ctx.Process(target=_report_forked, args=(queue,))
    child.start()
    assert queue.get(timeout=60) is True
    child.join(timeout=30)
    assert forked_from_fork_server() is False  # pytest's own process
