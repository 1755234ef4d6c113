"""Benchmark: one SuperLink carrying many SuperNodes, then some of them too slow for the round.

Issue 62, item 3. A real SuperLink, its ServerApp SuperExec and N SuperNodes on loopback, TLS
and node authentication on (the e2e tests' :class:`Cluster`, laid out from
``docker/topology.yaml``), every node with warm ClientApps (``--isolation process`` beside a
``pflower-superexec``) and started by ``pflower-supernode``. Workload: FedAvg, LeNet-5 on the
digits (each node holds its own IID share, ``dataset=local``), ``--per-round`` clients a round,
1 local epoch. Two runs, each on a freshly started federation:

* **all on time**: ``--rounds`` rounds;
* **slow**: the same, with ``--slow`` of the nodes holding every reply back past the round's
  timeout (the test-only node config ``test-fault=slow:<seconds>``); then the run is resumed
  from its checkpoint for 2 more rounds (``resume=<run dir>``) on the same federation.

Every node process runs at nice 10 (``NODE_NICE``: on one machine they stand in for devices of
their own, and the SuperLink must not starve behind them).

Measured for each federation: how long it takes to come up (from the first process started to
every SuperNode accepted by the SuperLink), and while it lasts (a sampler thread, every
``--interval`` s):

* memory per node: the PSS (proportional set size: shared pages divided among the processes
  that map them) of the node's SuperNode, its SuperExec, the fork server and any ClientApp it
  forked, summed; the peak over the run, per node, then the median and largest over nodes.
  With ``--per-superexec K`` one ``pflower-superexec`` serves K SuperNodes (one fork server,
  torch imported once for the K): its processes' PSS is divided evenly among its nodes;
* the SuperLink's CPU: its process's user + system seconds over the idle minute before the run
  (the nodes only polling) and over the rounds, as a share of one core.

The slow run's record: per round, who was aggregated, who was dropped for "no reply before the
round timeout", which late replies the ServerApp refused (``late_replies`` in the round
record), and how many the SuperLink refused itself (its log: the message had expired).

Run: ``python -m benchmarks.many_nodes`` (``--nodes 50 --per-round 10 --rounds 5 --slow 10``).
The e2e test ``tests/e2e/test_deployment.py`` keeps a small version (one late reply, 4 nodes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.common import markdown_table, median, publish, run_header
from benchmarks.deployment import _cluster_module
from benchmarks.memory import children_map, process_tree, rss_pss

CLK_TCK = os.sysconf("SC_CLK_TCK")
IDLE_S = 60.0  # the idle window before a run: every node only polling
# The nodes (SuperNode, SuperExec, ClientApps) run at a lower CPU priority than the SuperLink and
# the ServerApp: on one machine they stand in for devices of their own, and the server must not
# starve behind them. Without it, 50 nodes on 2 cores answering the join query at once (30 of them
# starting a fresh ClientApp process each) held the cores so long that the ServerApp's TLS
# handshake with the SuperLink timed out and the run ended before round 1.
NODE_NICE = ["nice", "-n", "10"]
# SuperNodes started together, each batch accepted by the SuperLink before the next starts (as a
# fleet comes online over time). All 50 at once on 2 cores: 9 were refused. Most likely a node's
# activation timed out on its side but registered it online at the SuperLink, so its retry was
# refused (HTTP 412, FAILED_PRECONDITION) and Flower's SuperNode gave up after 2 tries (exit 305).
START_BATCH = 10
# memory a node needs, for the check before a run: a warm node with a SuperExec of its own (SuperNode,
# SuperExec, a fork server holding torch, its forked ClientApps; benchmarks/results/many_nodes.md:
# 560-606 MiB PSS at its peak); of it, the SuperNode process alone (115-122 MiB in the e2e
# clusters); a cold one idle (SuperNode and its SuperExec, no fork server: an estimate, not in that
# table; each message it runs starts a full ClientApp process besides); a ClientApp forked for a
# round, at most --per-round at once (an estimate)
WARM_NODE_MIB = 580
SUPERNODE_MIB = 125
COLD_NODE_MIB = 260
FORKED_APP_MIB = 150


def memory_needed_mib(nodes: int, warm: int, per_superexec: int, per_round: int) -> float:
    """What a federation should need at its peak, from the constants above: one warm node with
    its own SuperExec as measured; a shared SuperExec (fork server included) counted once for its
    group, and the ClientApps of a round on top."""
    if per_superexec == 1:
        return warm * WARM_NODE_MIB + (nodes - warm) * COLD_NODE_MIB
    superexecs = len(superexec_groups(warm, per_superexec))
    return (
        warm * SUPERNODE_MIB
        + superexecs * (WARM_NODE_MIB - SUPERNODE_MIB)
        + min(per_round, warm) * FORKED_APP_MIB
        + (nodes - warm) * COLD_NODE_MIB
    )


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def node_shares(owners: dict[int, list[int]], kib_of_tree: dict[int, int]) -> dict[int, float]:
    """Each node's memory: every process tree (by its root pid) divided evenly among the nodes
    that own it (a SuperNode: one; a SuperExec serving K SuperNodes: K)."""
    out: dict[int, float] = {}
    for root, nodes in owners.items():
        for node in nodes:
            out[node] = out.get(node, 0.0) + kib_of_tree.get(root, 0) / len(nodes)
    return out


class MemorySampler(threading.Thread):
    """Every ``interval`` s: each node's PSS (:func:`node_shares` of its process trees), keeping
    each node's peak; ``owners``: root pid -> the nodes its process tree serves."""

    def __init__(self, owners: dict[int, list[int]], interval: float) -> None:
        super().__init__(daemon=True)
        self.owners, self.interval = owners, interval
        self.peak: dict[int, float] = dict.fromkeys({n for nodes in owners.values() for n in nodes}, 0.0)
        self.peak_tree: dict[int, int] = dict.fromkeys(owners, 0)  # root pid -> its process tree's peak
        self.peak_total = 0
        self.min_available = _meminfo("MemAvailable")  # KiB: how close the machine came to its end
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            kids = children_map()  # one scan of /proc for every tree
            trees = {root: sum(rss_pss(p)[1] for p in process_tree(root, kids)) // 1024 for root in self.owners}
            for root, kib in trees.items():
                self.peak_tree[root] = max(self.peak_tree[root], kib)
            for node, kib in node_shares(self.owners, trees).items():
                self.peak[node] = max(self.peak[node], kib)
            self.peak_total = max(self.peak_total, sum(trees.values()))
            self.min_available = min(self.min_available, _meminfo("MemAvailable"))
            self.stop.wait(self.interval)


def superexec_groups(warm: int, per_superexec: int) -> list[range]:
    """The warm nodes in groups of ``per_superexec``, one pflower-superexec a group."""
    return [range(start, min(start + per_superexec, warm)) for start in range(0, warm, per_superexec)]


def start_federation(e2e: Any, tmp: Path, nodes: int, warm: int, slow: dict[int, float], per_superexec: int = 1) -> Any:
    """N SuperNodes started by pflower-supernode, the first ``warm`` with warm ClientApps (a
    pflower-superexec for every ``per_superexec`` of them, started with the group's last node),
    the others starting a fresh ClientApp process per message (``--isolation subprocess``);
    ``slow``: node -> seconds each reply is held back."""
    node_config = {
        i: {"torch-threads": 1, **({"test-fault": f"slow:{slow[i]:g}"} if i in slow else {})} for i in range(nodes)
    }
    cluster = e2e.Cluster(tmp, nodes=nodes, node_config=node_config, isolation="process")
    # pflower-supernode with its fast poll and Flower's 30 s heartbeat, as in the first table
    cluster.topo = replace(cluster.topo, launcher="pflower-supernode", heartbeat_interval=None, steady_poll=False)
    node_argv = cluster.node_argv

    def argv(i: int, **kw: Any) -> list[str]:
        out = list(node_argv(i, **kw))
        if i >= warm:
            out[out.index("--isolation") + 1] = "subprocess"
        return [*NODE_NICE, *out]

    start = cluster.start
    group_of = {i: group for group in superexec_groups(warm, per_superexec) for i in group}

    def start_unless_cold(name: str, args: list[str], home: str, netns_index: int | None = None) -> Any:
        kind, _, index = name.rpartition("-")
        i = int(index) if kind in ("supernode", "clientapp") else -1
        proc = None
        if kind != "clientapp":
            proc = start(name, args, home, netns_index)
        elif i < warm and i == group_of[i][-1]:  # (a cold node's SuperNode starts its ClientApps itself)
            # one pflower-superexec for the group, once its last SuperNode is up
            ports = ",".join(f"127.0.0.1:{cluster.runtime_ports[j]}" for j in group_of[i])
            args = [*args[:2], ports, *args[3:]]  # pflower-superexec --runtime-api-address A,B,... --insecure
            proc = start(name, [*NODE_NICE, *args], home, netns_index)
        last_of_node = kind == "clientapp" or (kind == "supernode" and i >= warm)
        if last_of_node and ((i + 1) % START_BATCH == 0 or i == nodes - 1):
            accepted(e2e, cluster, range(i - i % START_BATCH, i + 1))
        return proc

    cluster.node_argv, cluster.start = argv, start_unless_cold
    cluster.prepare(["dataset=digits", "partition=iid"])
    cluster.up(timeout=300)
    return cluster


def accepted(e2e: Any, cluster: Any, batch: range) -> None:
    """Wait until every node of ``batch`` is accepted by the SuperLink (its log has its node id);
    a node that gave up (Flower's exit 305) stops the benchmark with its log."""
    procs = {i: cluster.procs[f"supernode-{i}"] for i in batch}
    e2e.wait_for(
        lambda: all("SuperNode ID:" in p.text() or not p.alive() for p in procs.values()),
        300,
        f"SuperNodes {batch.start}-{batch.stop - 1} to be accepted",
        interval=0.5,
    )
    gone = [i for i, p in procs.items() if not p.alive()]
    if gone:
        raise RuntimeError(f"SuperNodes {gone} gave up joining:\n{procs[gone[0]].text()[-2000:]}")


def node_owners(cluster: Any, nodes: int, warm: int, per_superexec: int) -> dict[int, list[int]]:
    """Root pid -> the nodes it serves: each SuperNode its own, each pflower-superexec its group."""
    owners = {cluster.procs[f"supernode-{i}"].pid: [i] for i in range(nodes)}
    for group in superexec_groups(warm, per_superexec):
        owners[cluster.procs[f"clientapp-{group[-1]}"].pid] = list(group)
    return owners


def run_rounds(e2e: Any, cluster: Any, config: str, rounds: int, deadline_s: float, log_name: str) -> dict[str, Any]:
    """One ``flwr run``; returns its round records, wall time and the SuperLink's CPU seconds."""
    link = cluster.procs["superlink"].pid
    cpu0, t0 = cpu_s(link), time.monotonic()
    run = cluster.flwr_run(config, log_name=log_name)
    e2e.wait_for(lambda: not run.alive(), deadline_s, f"{log_name} to finish", interval=1.0)
    wall, cpu = time.monotonic() - t0, cpu_s(link) - cpu0
    run_dir = cluster.run_dir("fedavg")
    records = cluster.rounds("fedavg")
    if run.popen.returncode != 0 or len(records) != rounds:
        raise RuntimeError(
            f"{log_name}: exit {run.popen.returncode}, {len(records)} of {rounds} rounds:\n{run.text()[-4000:]}"
        )
    return {"records": records, "wall": wall, "link_cpu": cpu, "run_dir": run_dir}


def one_federation(args: argparse.Namespace, slow: dict[int, float], tmp: Path) -> dict[str, Any]:
    e2e = _cluster_module()
    t_up = time.monotonic()
    cluster = start_federation(e2e, tmp, args.nodes, args.warm, slow, args.per_superexec)
    try:
        up_s = time.monotonic() - t_up  # every SuperNode accepted (start_federation waits, batch by batch)
        link = cluster.procs["superlink"].pid
        sampler = MemorySampler(node_owners(cluster, args.nodes, args.warm, args.per_superexec), args.interval)
        sampler.start()
        time.sleep(30)  # the warm fork servers up (each imports torch once) before the idle window
        idle0 = cpu_s(link)
        time.sleep(IDLE_S)
        idle_cpu = cpu_s(link) - idle0
        timeout = args.timeout if slow else 300

        def config(rounds: int, **extra: Any) -> str:
            return cluster.topo.run_config(
                output_dir=cluster.place.output_dir,
                rounds=rounds,
                method="fedavg",
                fraction=args.per_round / args.nodes,
                local_epochs=1,
                batch_size=32,
                overrides=f"final_eval=false round_timeout={timeout}",
                **extra,
            )

        deadline = 300 + args.rounds * (timeout + 60)
        result = run_rounds(e2e, cluster, config(args.rounds), args.rounds, deadline, "flwr-run")
        result.update(up_s=up_s, idle_cpu=idle_cpu, timeout=timeout)
        if slow:  # resume the run for 2 more rounds on the same federation
            resumed_config = config(args.rounds + 2, resume=str(result["run_dir"]))
            resumed = run_rounds(e2e, cluster, resumed_config, args.rounds + 2, 300 + 2 * (timeout + 60), "flwr-resume")
            resumed["summary"] = json.loads((resumed["run_dir"] / "summary.json").read_text())
            resumed["same_dir"] = resumed["run_dir"] == result["run_dir"]
            result["resumed"] = resumed
            time.sleep(max(slow.values()) - timeout + 5)  # the last slow replies reach the SuperLink
        sampler.stop.set()
        sampler.join()
        supernodes = {cluster.procs[f"supernode-{i}"].pid for i in range(args.nodes)}
        result.update(
            peak=sampler.peak,
            supernode_peaks=sorted(k for r, k in sampler.peak_tree.items() if r in supernodes),
            superexec_peaks=sorted(k for r, k in sampler.peak_tree.items() if r not in supernodes),
            peak_total=sampler.peak_total,
            min_available=sampler.min_available,
            link_log=cluster.procs["superlink"].text(),
            mem_total_kib=_meminfo("MemTotal"),
        )
        return result
    finally:
        cluster.close()


def _meminfo(key: str) -> int:
    found = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    return int(found.group(1)) if found else 0


def load_row(name: str, args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any]:
    recs = result["records"]
    warm = sorted(kib for i, kib in result["peak"].items() if i < args.warm)
    cold = sorted(kib for i, kib in result["peak"].items() if i >= args.warm)
    rounds_s = [r["round_time_s"] for r in recs]

    def per_message(key: str) -> str:
        values = [r[key] / len(r["clients"]) for r in recs if r.get("clients") and key in r]
        return f"{median(values):.2f}" if values else "-"

    def mib(values: list[int]) -> str:
        return f"{median(values) / 1024:.0f}, {values[-1] / 1024:.0f}" if values else "-"

    return {
        "run": name,
        "nodes": args.nodes,
        "clients a round": args.per_round,
        "rounds": len(recs),
        "federation up s": f"{result['up_s']:.0f}",
        "round s (median)": f"{median(rounds_s):.1f}",
        "a message: start, train, eval s": ", ".join(
            per_message(k) for k in ("client_cold_start_s", "client_train_s", "client_eval_s")
        ),
        "warm nodes": len(warm),
        "SuperExecs": len(result["superexec_peaks"]),
        "warm node PSS MiB (median, max)": mib(warm),
        "of it: SuperNode, SuperExec MiB (medians)": (
            f"{median(result['supernode_peaks']) / 1024:.0f}, "
            + (f"{median(result['superexec_peaks']) / 1024:.0f}" if result["superexec_peaks"] else "-")
        ),
        "cold node PSS MiB (median, max)": mib(cold),
        "all nodes PSS GiB (peak)": f"{result['peak_total'] / 2**20:.1f}",
        "machine's available GiB (lowest)": f"{result['min_available'] / 2**20:.1f}",
        "SuperLink CPU, idle": f"{100 * result['idle_cpu'] / IDLE_S:.1f} %",
        "SuperLink CPU, rounds": f"{100 * result['link_cpu'] / result['wall']:.1f} %",
    }


def slow_rows(result: dict[str, Any], slow: set[int]) -> list[dict[str, Any]]:
    rows = []
    for r in result["records"] + result.get("resumed", {}).get("records", [])[len(result["records"]) :]:
        dropped = [d["client"] for d in r["dropped"] if d["reason"] == "no reply before the round timeout"]
        on_time_dropped = [c for c in dropped if c not in slow]
        late = r.get("late_replies", [])
        rows.append(
            {
                "round": r["round"],
                "aggregated": len(r["clients"]),
                "slow sampled": len([c for c in [*r["clients"], *dropped] if c in slow]),
                "dropped (no reply in time)": ", ".join(map(str, dropped)) or "-",
                "of them not slowed": ", ".join(map(str, on_time_dropped)) or "-",
                "late replies refused": ", ".join(
                    f"{x['client']} (round {x['round']}, +{x['late_s']:.0f} s)" for x in late
                )
                or "-",
                "round s": f"{r['round_time_s']:.1f}",
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warm", type=int, help="nodes with warm ClientApps, the first ones (default: all)")
    parser.add_argument("--slow", type=int, default=10, help="nodes (the last ones) too slow for the round")
    parser.add_argument(
        "--timeout", type=float, default=90.0, help="round_timeout of the slow run (s): above an on-time round's"
    )
    parser.add_argument("--late", type=float, default=30.0, help="how far past the timeout a slow reply comes (s)")
    parser.add_argument("--interval", type=float, default=2.0, help="memory sampling period (s)")
    parser.add_argument(
        "--per-superexec",
        type=int,
        default=1,
        help="warm SuperNodes one pflower-superexec serves (one fork server for them all; default 1: one a node)",
    )
    parser.add_argument("--only", choices=["on-time", "slow"], help="run one of the two")
    parser.add_argument("--out", default="benchmarks/results/many_nodes.md")
    args = parser.parse_args(argv)
    args.warm = args.nodes if args.warm is None else min(args.warm, args.nodes)
    if args.per_superexec < 1:
        raise SystemExit(f"--per-superexec {args.per_superexec}: give 1 or more SuperNodes a SuperExec")
    need = memory_needed_mib(args.nodes, args.warm, args.per_superexec, args.per_round) / 1024
    have = _meminfo("MemAvailable") / 2**20
    if need > 0.9 * have:
        raise SystemExit(
            f"{args.nodes} nodes ({args.warm} warm) need about {need:.1f} GiB, this machine has {have:.1f} GiB "
            f"available: pass fewer --nodes (or --warm)"
        )
    started = time.time()
    slow = {i: args.timeout + args.late for i in range(args.nodes - args.slow, args.nodes)}
    results: dict[str, dict[str, Any]] = {}
    for name, which in (("all on time", {}), ("slow", slow)):
        if args.only and args.only != ("slow" if which else "on-time"):
            continue
        with tempfile.TemporaryDirectory(prefix="pflower-many-nodes-") as tmp:
            results[name] = one_federation(args, which, Path(tmp))
        print(name, json.dumps(load_row(name, args, results[name])), flush=True)
    layout = (
        "a `pflower-superexec` each"
        if args.per_superexec == 1
        else f"one `pflower-superexec` for every {args.per_superexec} SuperNodes: one fork server for them"
    )
    parts = [
        "# Many SuperNodes on one SuperLink",
        run_header("python -m benchmarks.many_nodes " + " ".join(argv if argv is not None else sys.argv[1:]), started),
        f"{args.nodes} SuperNodes on loopback, TLS and node authentication on, started by "
        f"`pflower-supernode` (its fast poll, Flower's 30 s heartbeat); nodes 0-{args.warm - 1} with warm "
        f"ClientApps ({layout}), "
        + ("the others a fresh ClientApp process per message; " if args.warm < args.nodes else "")
        + "the nodes at nice 10, the SuperLink and "
        f"ServerApp at 0 (the nodes stand in for devices of their own: see NODE_NICE); FedAvg, LeNet-5, "
        f"digits (IID shares), "
        f"{args.per_round} clients a round, 1 local epoch. Memory: PSS per node (SuperNode, SuperExec, "
        f"fork server, forked ClientApps), the peak over the run; machine memory "
        f"{next(iter(results.values()))['mem_total_kib'] / 2**20:.1f} GiB. SuperLink CPU: share of one "
        f"core over the {IDLE_S:.0f} s before the run (nodes polling) and over the run.",
        markdown_table([load_row(n, args, r) for n, r in results.items()], COLUMNS),
    ]
    if "slow" in results:
        res = results["slow"]
        slow_clients = set(slow)
        # Flower's SuperLink: a reply to an expired message, or to a run that has finished
        refused_by_link = len(re.findall(r"has expired|Invalid run ID for Message", res["link_log"]))
        resumed = res["resumed"]
        summary = resumed["summary"]
        parts += [
            "## The slow run",
            f"Nodes {min(slow)}-{max(slow)} hold every train reply back {args.timeout + args.late:g} s "
            f"(`test-fault=slow:{args.timeout + args.late:g}`); `round_timeout={res['timeout']:g}`. Rounds "
            f"1-{args.rounds}, then resumed from the checkpoint for 2 more (rounds {args.rounds + 1}-"
            f"{args.rounds + 2}, a new `flwr run` with `resume=<run dir>`). A late reply is listed in "
            "the round it came in.",
            markdown_table(slow_rows(res, slow_clients), SLOW_COLUMNS),
            f"Late replies the SuperLink refused itself (their message had expired, or their run had "
            f"ended): {refused_by_link}. "
            f"Resumed: `resumed_after_rounds` {summary.get('resumed_after_rounds')}, rounds in the "
            f"run directory's metrics.jsonl after it: {[r['round'] for r in resumed['records']]} "
            f"({'the same' if resumed['same_dir'] else 'another'} run directory).",
        ]
    publish("\n\n".join(parts), args.out)
    return 0


COLUMNS = [
    "run",
    "nodes",
    "clients a round",
    "rounds",
    "federation up s",
    "round s (median)",
    "a message: start, train, eval s",
    "warm nodes",
    "SuperExecs",
    "warm node PSS MiB (median, max)",
    "of it: SuperNode, SuperExec MiB (medians)",
    "cold node PSS MiB (median, max)",
    "all nodes PSS GiB (peak)",
    "machine's available GiB (lowest)",
    "SuperLink CPU, idle",
    "SuperLink CPU, rounds",
]
SLOW_COLUMNS = [
    "round",
    "aggregated",
    "slow sampled",
    "dropped (no reply in time)",
    "of them not slowed",
    "late replies refused",
    "round s",
]


if __name__ == "__main__":
    raise SystemExit(main())
