"""Benchmark 2: server-side scaling of each strategy's per-round math.

What is timed is one round of the server's own math on the round's updates, exactly what the
strategy base calls: ``aggregate(r, updates)`` (the server update) and then
``downlinks(ids, r + 1)`` + ``extra_downlinks(ids, r + 1)`` (the tensors of the next round's
messages: for the personalized methods a model mixed per client from the stored ones).
Every client takes part (fraction 1, so N = n clients and n updates per round), with the
LeNet-5 (44,470 parameters) and ResNet18 (11.2 M) shapes. The state a round finds is the
steady state of a long run (``prepare``): every client has a stored model (and pFedLA a
trained hypernetwork), similarity rows are dense, FedCMD is in phase 2. Message encoding,
reply validation and the network are not included (``benchmarks/communication.py`` measures
the messages).

Each case (strategy x model x n) runs in a forked child: median wall time of ``--repeats``
rounds (each on a freshly prepared strategy; the repeats stop early once a case has used
``--case-seconds``, the ``runs`` column says how many ran) and the peak RSS above what the
child held before the first round (the updates, the stored state; ``/proc/self/clear_refs``
resets the peak), which counts numpy, torch and BLAS alike. BLAS and torch run on
``--threads`` threads (default 1: on a machine shared with other jobs, two OpenBLAS threads
spin-waiting for a busy core made the products 3-10x slower and the timings erratic). Cases
whose updates alone need more than ``--budget-gb`` (default a quarter of the machine's RAM)
are skipped and say so: 1000 ResNet18 updates are 42 GiB, which a server holding a round's
replies at once (Flower's ``send_and_receive`` returns them together) could not hold here
either.

Every registered method with its own server math is measured: a method with no line in
:data:`TUNED_CASES` gets a default case (its default options, round 2, nothing stored), so a new
method needs no line here; a line sets a steady state (a ``prepare`` function), options, or a
variant under its own name (``cfl_split``).

Run: ``python -m benchmarks.server_scaling`` (``--quick`` for a seconds-long smoke run;
``--sizes``, ``--models``, ``--strategies``, ``--repeats``, ``--threads``).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import markdown_table, median, run_header, write_result

MODELS: dict[str, tuple[str, tuple[int, int, int], int]] = {
    "lenet5": ("lenet5", (1, 28, 28), 10),
    "resnet18": ("resnet18", (3, 32, 32), 10),
}
# the per-client store measurement (--store): FedCPMD's stored bodies with VGG11
STORE_MODELS: dict[str, dict[str, Any]] = {
    "vgg11": {"pool_size": 7, "fc_dim": 4096},  # the paper's layout: fc1 25088 -> 4096, 128.8 M parameters
    "vgg11_small": {"pool_size": 1, "fc_dim": 512},  # the CIFAR-style head, 9.8 M parameters
}
STORE_RESULT = "benchmarks/results/server_store.md"
SIZES = (10, 100, 1000)
RESULT = "benchmarks/results/server_scaling.md"


# ----------------------------------------------------------------------------- state a round finds
Prepare = Callable[[Any, list[Any], int], None]


def server_only_spec() -> dict:
    """A client spec for a server measured alone: training settings, no data spec (FedMD reads
    its transfer set from a data spec when one is given)."""
    from pflower.strategies import client_spec

    spec = client_spec()
    del spec["data"]
    return spec


def nothing(strategy: Any, updates: list[Any], rnd: int) -> None:
    """FedAvg-like methods: no state but the global model."""


def stored_models(strategy: Any, updates: list[Any], rnd: int) -> None:
    """Every client's latest model is stored (FedAMP, pFedLA): the steady state. Filled in place, so a
    strategy whose ``models`` is a :class:`strategies.base.store.ClientStore` keeps that type (KAPC reads
    ``keys_of`` from it)."""
    strategy.models.clear()
    for u in updates:
        strategy.models[u.client_id] = u.arrays


def pfedla_steady(strategy: Any, updates: list[Any], rnd: int) -> None:
    """pFedLA: every client's model stored and every client's hypernetwork updated before (N x L N heads)."""
    stored_models(strategy, updates, rnd)
    strategy.hypernets = {
        u.client_id: {
            **{k: v.copy() for k, v in strategy.initial_hypernet.items()},
            "embedding": strategy.embeddings[u.client_id].copy(),
        }
        for u in updates
    }


def pfedsim_personal(strategy: Any, updates: list[Any], rnd: int) -> None:
    """pFedSim after the warm-up: every body stored, every classifier held, a dense similarity matrix."""
    body = strategy.model.keys(strategy.body)
    strategy.bodies = {u.client_id: {k: u.arrays[k] for k in body} for u in updates}
    strategy.head_seen = {u.client_id for u in updates}
    rng = np.random.default_rng(1)
    s = rng.uniform(0.1, 0.9, strategy.sim.shape)
    strategy.sim = np.minimum(s, s.T)
    np.fill_diagonal(strategy.sim, 1.0)


def fedcmd_phase2(strategy: Any, updates: list[Any], rnd: int) -> None:
    """FedCMD in phase 2 with l* = the first candidate (LeNet-5: fc1, ResNet18: the classifier),
    every client holding its phi and a personalized post(l*) from an earlier round."""
    strategy.force_layer = strategy.state.candidates[0]
    strategy.personal_layer()
    post = strategy.model.keys(strategy.post_groups())
    strategy.state.post_store = {u.client_id: {k: u.arrays[k].copy() for k in post} for u in updates}
    strategy.state.phi_seen = {u.client_id for u in updates}


def fedfomo_offered(strategy: Any, updates: list[Any], rnd: int) -> None:
    """FedFomo: every client's model stored, each client was offered m of them and weighted them."""
    stored_models(strategy, updates, rnd)
    strategy.model_round = {u.client_id: rnd - 1 for u in updates}
    ids = [u.client_id for u in updates]
    extra_downlinks(strategy, ids, rnd)  # sets strategy.offered, as configure_train does
    from pflower.client_app.roles.fedfomo import FOMO_WEIGHT_METRIC as WEIGHT_METRIC

    for u in updates:
        for j in strategy.offered.get(u.client_id, []):
            u.metrics[f"{WEIGHT_METRIC}{j}"] = 0.1


def fedap_personal(strategy: Any, updates: list[Any], rnd: int) -> None:
    """FedAP after the warm-up: every client's BN statistics and model known."""
    rng = np.random.default_rng(2)
    stored_models(strategy, updates, rnd)
    strategy.stats = {
        u.client_id: {
            f"bn_{s}/{i}": rng.uniform(0.5, 1.5, c).astype(np.float32)
            for i, c in enumerate(strategy.bn_channels)
            for s in ("mean", "var")
        }
        for u in updates
    }


def fedtsdp_public(strategy: Any, updates: list[Any], rnd: int) -> None:
    """FedTSDP's public data (500 random images of the model's input shape); with h_th = 0 every
    timed round re-clusters: n model forwards on the public batch, the n x n JS matrix, Hopkins,
    DBSCAN and the Gram matrices inside the stage-1 groups are all in the timing."""
    import torch

    for _, shape, _ in MODELS.values():
        try:
            with torch.no_grad():
                strategy._probe.eval()(torch.zeros(1, *shape))
        except RuntimeError:
            continue
        strategy.attach_public(torch.randn(500, *shape, generator=torch.Generator().manual_seed(0)))
        return
    raise ValueError("no benchmark input shape fits the model")


def fedcpmd_phase2(strategy: Any, updates: list[Any], rnd: int) -> None:
    """FedCPMD in phase 2: the candidate layers dealt round-robin to the clients (LeNet-5: three
    clusters on fc1, fc2, classifier), every client holding a stored body from an earlier round."""
    fill_fedcpmd_phase2(strategy, [u.client_id for u in updates], rnd, {u.client_id: u.arrays for u in updates})


def fill_fedcpmd_phase2(
    strategy: Any, ids: Sequence[int], rnd: int, arrays: Mapping[int, Mapping[str, np.ndarray]]
) -> None:
    from pflower.strategies.shared.clustering import groups_by_label
    from pflower.strategies.shared.clusters import Clusters

    strategy.phase1_end = rnd - 1
    strategy.layer_of = {c: strategy.candidates[i % len(strategy.candidates)] for i, c in enumerate(ids)}
    strategy.votes = {c: [(1, layer)] for c, layer in strategy.layer_of.items()}
    members = groups_by_label(strategy.layer_of)
    strategy.cluster_layers = [strategy.layer_of[m[0]] for m in members]
    strategy.clusters = Clusters(
        members, [strategy._cluster_start(m, l) for m, l in zip(members, strategy.cluster_layers)]
    )
    for c in ids:
        body = strategy.model.keys(strategy.cluster_groups(strategy.layer_of[c]))
        copy = not getattr(strategy.bodies, "on_disk", False)  # in memory every client holds its own arrays
        strategy.bodies[c] = {k: np.array(arrays[c][k], copy=True) if copy else arrays[c][k] for k in body}


@dataclass(frozen=True)
class Case:
    """One benchmarked strategy: registry name, options, the round timed and the state it finds."""

    method: str
    options: Mapping[str, Any] = field(default_factory=dict)
    prepare: Prepare = nothing
    round: int = 2


def case(method: str, prepare: Prepare = nothing, round: int = 2, **options: Any) -> Case:
    return Case(method, options, prepare, round)


# cases whose steady state needs stored state, options or a round of their own; a variant of a
# method gets its own name (cfl_split). Methods not named here get a default case (with_default_cases).
TUNED_CASES: dict[str, Case] = {
    "fedavg": case("fedavg"),
    "feddyn": case("feddyn"),
    "fedcmd": case("fedcmd", fedcmd_phase2, round=21, kp=20),
    "pfedsim": case("pfedsim", pfedsim_personal, warmup=0),
    "cfl": case("cfl"),
    "cfl_split": case("cfl", round=20, eps1=1e9, eps2=0.0),
    "fedamp": case("fedamp", stored_models),
    "pfedla": case("pfedla", pfedla_steady),
    "fedfomo": case("fedfomo", fedfomo_offered, pool="all"),
    "fedap": case("fedap", fedap_personal, warmup=0),
    "fedcpmd": case("fedcpmd", fedcpmd_phase2, round=62, kp=60),
    "kapc": case("kapc", stored_models),  # the cube step's Gram matrices over the participants, s_i for each
    "kapc_bls": case("kapc_bls", stored_models),
    "fedtsdp": case("fedtsdp", fedtsdp_public, h_th=0.0),  # a re-clustering every round (the expensive one)
    "felo": case("felo", warmup=0.0),  # per-architecture FedAvg + the class-knowledge store and its means
    "fedhe": case("fedhe", warmup=0.0),  # logits only, no weights
    "velo": case("velo", warmup=0.0),  # + a CVAE training on every stored feature (interval 1) and one decode
}


SERVER_MATH = ("aggregate", "downlink", "downlinks", "extra_downlink", "extra_downlinks")


def base_math_methods() -> list[str]:
    """Registered methods whose server math is the base's (FedAvg of what they upload, global
    values down): the ``fedavg`` row is their cost, on the keys they share. Every other
    registered method must have a case (tests/unit/test_benchmarks.py checks it)."""
    from pflower.strategies import STRATEGIES, PersonalizedStrategy

    return [
        name
        for name, cls in STRATEGIES.items()
        if all(getattr(cls, m, None) is getattr(PersonalizedStrategy, m, None) for m in SERVER_MATH)
    ]


def with_default_cases(tuned: Mapping[str, Case]) -> dict[str, Case]:
    """``tuned`` plus ``case(method)`` for every registered method with its own server math that
    ``tuned`` does not measure."""
    covered = {c.method for c in tuned.values()}
    own_math = sorted(set(_strategies()) - set(base_math_methods()) - covered)
    return {**tuned, **{m: case(m) for m in own_math}}


def _strategies() -> dict[str, Any]:
    from pflower.strategies import STRATEGIES

    return STRATEGIES


CASES: dict[str, Case] = with_default_cases(TUNED_CASES)


# ----------------------------------------------------------------------------- one round
def downlinks(strategy: Any, ids: Sequence[int], rnd: int) -> dict[int, dict[str, np.ndarray]]:
    if hasattr(strategy, "downlinks"):
        return strategy.downlinks(ids, rnd)
    return {c: strategy.downlink(c, rnd) for c in ids}  # strategy bases without the batched hook


def extra_downlinks(strategy: Any, ids: Sequence[int], rnd: int) -> dict[int, dict[str, np.ndarray]]:
    if hasattr(strategy, "extra_downlinks"):
        return strategy.extra_downlinks(ids, rnd)
    return {c: strategy.extra_downlink(c, rnd) for c in ids}


def server_round(strategy: Any, updates: Sequence[Any], rnd: int) -> tuple[float, float]:
    """(seconds in aggregate, seconds building the next round's downlinks) of one round."""
    ids = [u.client_id for u in updates]
    t0 = time.perf_counter()
    strategy.aggregate(rnd, updates)
    t1 = time.perf_counter()
    down = downlinks(strategy, ids, rnd + 1)
    extra = extra_downlinks(strategy, ids, rnd + 1)
    t2 = time.perf_counter()
    del down, extra
    return t1 - t0, t2 - t1


def build(name: str, model: Any, n: int) -> Any:
    from pflower.strategies import build_strategy
    from pflower.strategies.base.client_directory import ClientInfo

    c = CASES[name]
    strategy = build_strategy(
        c.method, model, server_only_spec(), num_clients=n, fraction_train=1.0, seed=0, method_args=dict(c.options)
    )
    # every client as if discovered (node 1000 + i, 50 training and 20 test samples): a method whose
    # uploads are sized by the client's data (FedGKT's features) declares them from this
    strategy.directory.clients.update({i: ClientInfo(1000 + i, 50, 20) for i in range(n)})
    return strategy


def make_updates(strategy: Any, n: int, rnd: int) -> list[Any]:
    """n plausible replies: the global model plus small distinct noise, every uplinked key.

    Each update is one float32 buffer (keys are views of it), filled in place from a shared
    noise pool so that building them leaves no freed memory behind (the RSS peak stays clean).
    """
    from pflower.strategies.base.validation import ClientUpdate

    up = strategy.uplink(0, rnd)
    keys = strategy.travelling_keys(up.groups, 0, rnd)
    sizes = [int(np.prod(strategy.model.template[k][0])) for k in keys]
    total = sum(sizes)
    base = np.concatenate([strategy.model.global_arrays[k].reshape(-1) for k in keys] or [np.zeros(0)]).astype(
        np.float32
    )  # FedHe: no weights
    pool = np.random.default_rng(0).standard_normal(total + 7 * n + 1, dtype=np.float32)
    pool *= 0.01
    extra_spec = up.extra
    updates = []
    for i in range(n):
        flat = np.empty(total, np.float32)
        np.add(base, pool[7 * i : 7 * i + total], out=flat)
        arrays, start = {}, 0
        for k, size in zip(keys, sizes):
            arrays[k] = flat[start : start + size].reshape(strategy.model.template[k][0])
            start += size
        extra = {k: np.ones(shape, dtype) for k, (shape, dtype) in extra_spec.items()}
        # fim_trace: the metric FedAS weights its average by
        metrics = {
            "num-examples": float(50 + i % 50),
            "client-id": float(i),
            "test_size": 20.0,
            "train_loss": 1.0,
            "fim_trace": 1.0,
        }
        extra_bytes = sum(v.nbytes for v in extra.values())
        updates.append(
            ClientUpdate(i, 1000 + i, arrays, 50 + i % 50, metrics, extra=extra, bytes_up=4 * total + extra_bytes)
        )
    del pool
    return updates


def input_bytes(name: str, model_name: str, n: int) -> int:
    """Bytes of one round's updates, from the strategy's uplink (no arrays built)."""
    from pflower.models import build_model

    arch, shape, classes = MODELS[model_name]
    try:
        strategy = build(name, build_model(arch, shape, classes, seed=0), 2)
    except ValueError:
        return 0  # the case reports why it cannot run
    rnd = CASES[name].round
    up = strategy.uplink(0, rnd)
    keys = strategy.travelling_keys(up.groups, 0, rnd)
    extra = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in up.extra.values())
    return n * (sum(int(np.prod(strategy.model.template[k][0])) * 4 for k in keys) + extra)


# ----------------------------------------------------------------------------- memory probes
def _status(field_name: str) -> int:
    """A VmXXX line of /proc/self/status, in bytes (0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"^{field_name}:\s+(\d+) kB", f.read(), re.MULTILINE)
        return int(m.group(1)) * 1024 if m else 0
    except OSError:
        return 0


def reset_peak() -> bool:
    """Reset the peak RSS (VmHWM) to the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            m = re.search(r"^MemAvailable:\s+(\d+) kB", f.read(), re.MULTILINE)
        return int(m.group(1)) * 1024 if m else 0
    except OSError:
        return 0


def total_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


# ----------------------------------------------------------------------------- one case, in a child
def run_case(name: str, model_name: str, n: int, repeats: int, case_seconds: float, threads: int = 1) -> dict[str, Any]:
    """Time ``repeats`` rounds of one strategy at n updates; the RSS peak of the first one."""
    import logging

    import torch
    from threadpoolctl import threadpool_limits

    from pflower.models import build_model

    logging.getLogger("flwr").setLevel(logging.WARNING)  # no per-case INFO lines (FedCMD's l*, CFL's splits)
    threadpool_limits(threads)  # BLAS (numpy's OpenBLAS)
    torch.set_num_threads(threads)
    np.ones((64, 512)) @ np.ones((512, 64))  # start BLAS's threads and buffers before measuring
    arch, shape, classes = MODELS[model_name]
    model = build_model(arch, shape, classes, seed=0)
    c = CASES[name]
    try:
        strategy = build(name, model, n)
    except ValueError as exc:  # e.g. FedAP on a model without BatchNorm
        return {"status": "n/a", "reason": str(exc).split(":")[0]}
    updates = make_updates(strategy, n, c.round)
    aggregate_s, downlink_s, total_s, peak = [], [], [], None
    spent = 0.0
    for r in range(repeats):
        if r:
            strategy = build(name, model, n)
        c.prepare(strategy, updates, c.round)
        if r == 0:
            measured = reset_peak()
            before = _status("VmRSS")
        a, d = server_round(strategy, updates, c.round)
        if r == 0 and measured:
            peak = max(0, _status("VmHWM") - before)
        aggregate_s.append(a)
        downlink_s.append(d)
        total_s.append(a + d)
        spent += a + d
        del strategy
        if spent > case_seconds:
            break
    return {
        "status": "ok",
        "aggregate_s": median(aggregate_s),
        "downlink_s": median(downlink_s),
        "total_s": median(total_s),
        "runs": len(total_s),
        "peak_bytes": peak,
        "input_bytes": sum(u.bytes_up for u in updates),
    }


def _child(conn: Any, args: tuple) -> None:
    try:
        conn.send(run_case(*args))
    except BaseException as exc:  # noqa: BLE001 - reported in the table
        conn.send({"status": "error", "reason": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})
    finally:
        conn.close()


def measure(
    name: str, model_name: str, n: int, repeats: int, case_seconds: float, timeout: float, threads: int = 1
) -> dict[str, Any]:
    """run_case in a forked child (a fresh heap and a fresh RSS peak per case); killed after ``timeout``."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, (name, model_name, n, repeats, case_seconds, threads)))
    proc.start()
    child.close()
    result: dict[str, Any] | None = None
    if parent.poll(timeout):
        try:
            result = parent.recv()
        except EOFError:
            result = None
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
        if result is None:
            return {"status": "timeout", "reason": f"over {timeout:.0f} s"}
    if result is None:
        return {"status": "error", "reason": f"the child died (exit code {proc.exitcode}; out of memory?)"}
    return result


# ----------------------------------------------------------------------------- FedCPMD's store of bodies
def run_store(model_name: str, clients: int, participants: int, mode: str, directory: str) -> dict[str, Any]:
    """FedCPMD with ``clients`` stored bodies of a VGG11 (``mode`` memory or disk): the memory the
    store takes and one phase-2 round of ``participants`` updates (aggregate + downlinks)."""
    import logging
    import shutil

    from threadpoolctl import threadpool_limits

    from pflower.models import build_model
    from pflower.strategies import build_strategy

    logging.getLogger("flwr").setLevel(logging.WARNING)
    threadpool_limits(1)
    model = build_model("vgg11", (3, 32, 32), 10, seed=0, **STORE_MODELS[model_name])
    spec = {**server_only_spec(), "server_store": {"mode": mode, "dir": directory}}
    strategy = build_strategy(
        "fedcpmd",
        model,
        spec,
        num_clients=clients,
        fraction_train=participants / clients,
        seed=0,
        method_args={"kp": 60},
    )
    del model
    rnd = 62
    before = _status("VmRSS")
    template = {k: v for k, v in strategy.model.global_arrays.items()}
    t0 = time.perf_counter()
    fill_fedcpmd_phase2(strategy, list(range(clients)), rnd, {c: template for c in range(clients)})
    fill_s = time.perf_counter() - t0
    _trim()
    store_rss = max(0, _status("VmRSS") - before)
    stored = strategy.bodies.nbytes()
    disk = sum(f.stat().st_size for f in Path(directory).rglob("*.npy")) if mode == "disk" else 0
    updates = make_updates(strategy, participants, rnd)
    for i, u in enumerate(updates):  # participants spread over the clusters, as the per-cluster sampling does
        u.client_id = i * (clients // participants)
    measured = reset_peak()
    base = _status("VmRSS")
    a, d = server_round(strategy, updates, rnd)
    peak = max(0, _status("VmHWM") - base) if measured else None
    shutil.rmtree(directory, ignore_errors=True)
    return {
        "status": "ok",
        "stored_bytes": stored,
        "store_rss": store_rss,
        "disk_bytes": disk,
        "fill_s": fill_s,
        "round_s": a + d,
        "round_peak": peak,
        "params": sum(int(np.prod(t[0])) for t in strategy.model.template.values()),
    }


def _trim() -> None:
    """Return freed heap to the OS (glibc), so RSS shows what is held, not what was freed."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _store_child(conn: Any, args: tuple) -> None:
    try:
        conn.send(run_store(*args))
    except BaseException as exc:  # noqa: BLE001
        conn.send({"status": "error", "reason": f"{type(exc).__name__}: {exc}"})
    finally:
        conn.close()


def store_benchmark(clients: int, participants: int, budget: float, timeout: float) -> str:
    """The table of ``--store``: memory against disk for FedCPMD's bodies of ``clients`` VGG11 clients."""
    import tempfile

    from pflower.models import build_model

    rows = []
    for name, options in STORE_MODELS.items():
        params = sum(p.numel() for p in build_model("vgg11", (3, 32, 32), 10, seed=0, **options).parameters())
        # layers dealt round-robin over fc1, fc2, classifier: a body is everything but its layer
        need = clients * params * 4  # an upper bound (the classifier's clusters keep almost everything)
        for mode in ("memory", "disk"):
            row = {"model": name, "parameters": f"{params / 1e6:.1f} M", "clients": clients, "store": mode}
            if mode == "memory" and need > budget:
                row["stored GiB"] = f"skipped: up to {_gb(need)} > budget {_gb(budget)}"
                rows.append(row)
                continue
            ctx = mp.get_context("fork")
            parent, child = ctx.Pipe(duplex=False)
            directory = tempfile.mkdtemp(prefix="pflower-store-")
            proc = ctx.Process(target=_store_child, args=(child, (name, clients, participants, mode, directory)))
            proc.start()
            child.close()
            res = parent.recv() if parent.poll(timeout) else {"status": "timeout"}
            proc.join(5)
            if proc.is_alive():
                proc.kill()
            if res.get("status") != "ok":
                row["stored GiB"] = f"{res.get('status')}: {res.get('reason', '')}"
            else:
                row.update(
                    {
                        "stored GiB": f"{res['stored_bytes'] / 2**30:.2f}",
                        "RSS of the state GiB": f"{res['store_rss'] / 2**30:.2f}",
                        "on disk GiB": f"{res['disk_bytes'] / 2**30:.2f}" if mode == "disk" else "",
                        "writing it": _s(res["fill_s"]),
                        f"round of {participants}": _s(res["round_s"]),
                        "round peak MiB": _mb(res["round_peak"]),
                    }
                )
            rows.append(row)
            print(f"  store {name} {mode}: {row.get('stored GiB')}", file=sys.stderr, flush=True)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    return markdown_table(rows, cols)


# ----------------------------------------------------------------------------- the table
def _gb(b: float) -> str:
    return f"{b / 2**30:.1f} GiB"


def _mb(b: float | None) -> str:
    if b is None:
        return "n/a"
    return f"{b / 2**20:.1f}" if b < 100 * 2**20 else f"{b / 2**20:.0f}"


def _s(x: float) -> str:
    if x < 1e-3:
        return f"{x * 1e6:.0f} µs"
    if x < 1:
        return f"{x * 1e3:.1f} ms"
    return f"{x:.2f} s"


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "?"


def exponent(points: Sequence[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(value) against log(n): 1 = linear, 2 = quadratic."""
    pts = [(math.log(n), math.log(v)) for n, v in points if v and v > 0]
    if len(pts) < 2:
        return None
    xs, ys = zip(*pts)
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else None


def rows_of(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One table row per case; ratios against the previous size of the same strategy and model."""
    rows, previous = [], {}
    for r in results:
        key = (r["strategy"], r["model"])
        row = {"strategy": r["strategy"], "model": r["model"], "n": r["n"]}
        if r["status"] != "ok":
            row["round (median)"] = f"{r['status']}: {r.get('reason', '')}"
            rows.append(row)
            previous.pop(key, None)
            continue
        prev = previous.get(key)
        row.update(
            {
                "aggregate": _s(r["aggregate_s"]),
                "downlinks": _s(r["downlink_s"]),
                "round (median)": _s(r["total_s"]),
                "runs": r["runs"],
                "time x": f"{r['total_s'] / prev['total_s']:.1f}" if prev and prev["total_s"] > 0 else "",
                "peak MiB": _mb(r["peak_bytes"]),
                "mem x": (
                    f"{r['peak_bytes'] / prev['peak_bytes']:.1f}"
                    if prev and prev.get("peak_bytes") and r["peak_bytes"] is not None
                    else ""
                ),
                "inputs MiB": _mb(r["input_bytes"]),
            }
        )
        previous[key] = r
        rows.append(row)
    return rows


COLUMNS = [
    "strategy",
    "model",
    "n",
    "aggregate",
    "downlinks",
    "round (median)",
    "runs",
    "time x",
    "peak MiB",
    "mem x",
    "inputs MiB",
]


def growth_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fitted exponents of time and peak memory in n, per strategy and model (from the sizes that ran)."""
    out = []
    seen: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        seen.setdefault((r["strategy"], r["model"]), []).append(r)
    for (strategy, model), rs in seen.items():
        ok = [r for r in rs if r["status"] == "ok"]
        if len(ok) < 2:
            continue
        t = exponent([(r["n"], r["total_s"]) for r in ok])
        m = exponent([(r["n"], r["peak_bytes"]) for r in ok if r["peak_bytes"]])
        a, b = ok[-2:]
        out.append(
            {
                "strategy": strategy,
                "model": model,
                "sizes": ",".join(str(r["n"]) for r in ok),
                "time exponent": f"{t:.2f}" if t is not None else "",
                "memory exponent": f"{m:.2f}" if m is not None else "",
                "time exponent, last step": f"{exponent([(r['n'], r['total_s']) for r in (a, b)]):.2f} "
                f"({a['n']}->{b['n']})",
            }
        )
    return out


def benchmark(
    strategies: Sequence[str],
    models: Sequence[str],
    sizes: Sequence[int],
    repeats: int,
    budget: float,
    case_seconds: float,
    timeout: float,
    threads: int = 1,
    progress: bool = True,
) -> list[dict[str, Any]]:
    results = []
    for name in strategies:
        for model_name in models:
            for n in sizes:
                need = input_bytes(name, model_name, n)
                base = {"strategy": name, "model": model_name, "n": n}
                if need > budget:
                    res = {"status": "skipped", "reason": f"inputs need {_gb(need)} > budget {_gb(budget)}"}
                elif need * 2.5 > available_bytes() > 0:
                    res = {"status": "skipped", "reason": f"inputs need {_gb(need)}, {_gb(available_bytes())} free now"}
                else:
                    t0 = time.perf_counter()
                    res = measure(name, model_name, n, repeats, case_seconds, timeout, threads)
                    res["wall_s"] = time.perf_counter() - t0
                results.append({**base, **res})
                if progress:
                    shown = _s(res["total_s"]) if res["status"] == "ok" else f"{res['status']} {res.get('reason', '')}"
                    print(f"  {name:<10} {model_name:<9} n={n:<5} {shown}", file=sys.stderr, flush=True)
    return results


def report(
    results: Sequence[dict[str, Any]],
    command: str,
    wall: float,
    args: argparse.Namespace,
    load: tuple[str, str] = ("?", "?"),
) -> str:
    growth = growth_rows(results)
    gcols = list(dict.fromkeys(k for g in growth for k in g))
    return "\n\n".join(
        [
            "# Server-side scaling: per-round server math per strategy",
            run_header(command),
            (
                f"One round of server math at n updates per round (N = n clients, all taking part): "
                f"`aggregate` + building the next round's downlinks for the n clients. Median of up to "
                f"{args.repeats} rounds (`runs`; fewer once a case has used {args.case_seconds:.0f} s), each on a "
                f"freshly prepared strategy in its steady state; "
                f"`time x` / `mem x`: ratio to the previous n of the same strategy and model, measured in "
                f"this run; `peak MiB`: peak RSS above what the process held before the round (the "
                f"inputs, `inputs MiB`, and the stored state are not in it). Budget for inputs: "
                f"{_gb(args.budget_gb * 2**30)}."
            ),
            markdown_table(rows_of(results), COLUMNS),
            "Growth in n (least-squares slope of log time / log peak memory against log n; 1 = linear, 2 = quadratic; "
            "at small n fixed per-round costs pull it below the asymptote):",
            markdown_table(growth, gcols) if growth else "(fewer than two sizes ran)",
            "Registered methods whose server math is the base's FedAvg (the `fedavg` rows are their cost, on the "
            f"keys they share): "
            f"{', '.join(m for m in base_math_methods() if m not in {c.method for c in CASES.values()})}.",
            f"Total wall time: {wall:.0f} s on {os.cpu_count()} cores, BLAS/torch threads {args.threads}; "
            f"load average (1 min) {load[0]} at the start, {load[1]} at the end (other jobs share this machine).",
        ]
    )


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.server_scaling", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--strategies", default="all", help=f"comma-separated names of CASES (default all: {','.join(CASES)})"
    )
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: lenet5,resnet18")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="updates per round (default 10,100,1000)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds timed per case (median; default 5)")
    parser.add_argument(
        "--case-seconds", type=float, default=30.0, help="stop repeating a case after this many seconds of rounds"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="kill a case after this many seconds")
    parser.add_argument("--threads", type=int, default=1, help="BLAS and torch threads of the server math (default 1)")
    parser.add_argument(
        "--budget-gb",
        type=float,
        default=total_bytes() / 4 / 2**30,
        help="skip cases whose inputs exceed this (default RAM/4)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: LeNet-5, n = 2 and 4, one round each, nothing written"
    )
    parser.add_argument("--output", default=RESULT, help=f"where the report goes (default {RESULT}; '-' = nowhere)")
    parser.add_argument(
        "--store",
        type=int,
        default=0,
        metavar="N",
        help=f"instead: FedCPMD's stored bodies of N VGG11 clients, in memory and on disk (writes {STORE_RESULT})",
    )
    args = parser.parse_args(argv)
    if args.store:
        started = time.perf_counter()
        table = store_benchmark(args.store, max(1, args.store // 10), args.budget_gb * 2**30, args.timeout)
        command = "python -m benchmarks.server_scaling " + " ".join(argv if argv is not None else sys.argv[1:])
        text = "\n\n".join(
            [
                "# FedCPMD's per-client bodies: memory against disk (server_store)",
                run_header(command),
                f"{args.store} clients, the candidate layers dealt round-robin (fc1, fc2, classifier clusters); every "
                f"client holds a stored body (all but its layer). `RSS of the state`: resident memory the filled state "
                "adds (the "
                f"stored bodies, and in both modes the clusters' bodies, one per cluster); "
                f"`round`: one phase-2 round of {max(1, args.store // 10)} updates (aggregate + downlinks), with its "
                "peak RSS above the "
                "store. On disk the bodies are memory-mapped: the round reads only its clients'.",
                table,
                f"Total wall time: {time.perf_counter() - started:.0f} s.",
            ]
        )
        print(text)
        if args.output != "-":
            print(
                f"\nwritten to {write_result(STORE_RESULT if args.output == RESULT else args.output, text)}",
                file=sys.stderr,
            )
        return []
    if args.quick:
        args.models, args.sizes, args.repeats, args.output = "lenet5", "2,4", 1, "-"
    names = list(CASES) if args.strategies == "all" else args.strategies.split(",")
    unknown = [s for s in names if s not in CASES]
    models = args.models.split(",")
    if unknown or any(m not in MODELS for m in models):
        parser.error(
            f"unknown strategies {unknown} or models {models}; strategies: {list(CASES)}, models: {list(MODELS)}"
        )
    sizes = [int(s) for s in args.sizes.split(",")]
    started, load = time.perf_counter(), _load()
    results = benchmark(
        names, models, sizes, args.repeats, args.budget_gb * 2**30, args.case_seconds, args.timeout, args.threads
    )
    wall = time.perf_counter() - started
    command = "python -m benchmarks.server_scaling " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(results, command, wall, args, (load, _load()))
    print(text)
    if args.output != "-":
        print(f"\nwritten to {write_result(args.output, text)}", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
