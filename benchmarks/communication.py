"""Benchmark 3: communication per round for every method on the same model, from the actual messages.

Every registered method (``strategies.STRATEGIES``, so a new method joins by itself) runs the
same workload through the real strategy and the real ClientApp handlers, on an in-process
Grid (:mod:`simulation.inprocess`) that records every :class:`flwr.app.Message` going down
(server -> client) and up (client -> server). Each message is measured three ways:

* **wire**: what Flower 1.41 moves between SuperLink and SuperNode for it. A message no longer
  travels as one protobuf: the content-less message header and its object tree go in
  ``PullMessagesResponse``/``PushMessagesRequest``, then every object of the tree (the message,
  its RecordDict, each record, each Array and its <= 5 MiB ArrayChunks, deduplicated by
  content hash within the message) goes as its deflated bytes. Wire = header protobuf +
  object-tree protobuf + deflated objects. Not counted: gRPC/HTTP2 framing, TLS, the
  per-object request/response envelopes (~100 B each, a handful per tensor).
* **proto**: ``message_to_proto(msg).ByteSize()``, the whole message as one protobuf
  (metadata + arrays + config + metrics) with no object framing; a cross-check of wire.
* **arrays**: the bytes of the message's ArrayRecords (``Array.data``), which is what
  pflower's own accounting (``bytes_down``/``bytes_up`` in each round's record) counts. The
  benchmark checks, per round, that pflower's numbers equal the arrays of the captured
  messages and that no message is smaller on the wire than its arrays; wire - arrays (config,
  metrics, metadata, object framing) is reported per message.

Training rounds, the discovery queries (before round 1) and the final evaluation (after the
last round) are reported apart. Per-round numbers are medians over the rounds of a phase
(methods whose traffic changes over rounds: FedCMD phase 1/2, pFedSim/FedAP warm-up, or the
first round versus the rest, as FedFomo's first round has no peer models to send); ratios
are against FedAvg measured in the same run.

Workload: ``experiment=fedcmd_fmnist`` (LeNet-5 with 3 FC layers on Fashion-MNIST, 100
clients, 10 per round, FL-bench Dirichlet alpha 0.1: the FedCMD paper set-up) with 1 local
epoch and R rounds; FedCMD with Kp=2 phase-1 rounds. Bytes do not depend on the amount of
data, only on the model, the method and the clients per round.

Run: ``python -m benchmarks.communication`` (``--rounds``, ``--methods``, ``--quick``...).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flwr.app import Message

from benchmarks.common import markdown_table, median, run_header, write_result
from pflower.compat import wire_measures
from pflower.protocol.wire import WIRE_EXTRA_PREFIX as EXTRA_PREFIX
from pflower.simulation.inprocess import InProcessGrid

MIB = 2**20
KIB = 2**10
WORKLOAD = ["experiment=fedcmd_fmnist", "local_epochs=1", "final_eval=true", "checkpoint_every=0"]
QUICK = [  # seconds, not minutes: synthetic 28x28 images, the same LeNet-5
    "dataset=synthetic",
    "dataset.options.num_samples=600",
    "num_clients=6",
    "fraction=0.5",
    "partition.min_size=20",
    "alpha=1.0",
]
METHOD_ARGS = {
    "fedcmd": {"kp": 2},
    "fedcpmd": {"kp": 2},
}  # phase 1 for rounds 1..2, then phase 2 (papers: Kp=20 resp. 60 of 200)
REFERENCE = "fedavg"


# ---------------------------------------------------------------------------- measuring messages
@dataclass
class Size:
    """One message's size, three ways (bytes)."""

    arrays: int  # Array.data of its ArrayRecords: what pflower's bytes_down/bytes_up count
    proto: int  # message_to_proto(msg).ByteSize(): the message as one protobuf
    wire: int  # Flower 1.41's transport: header + object tree + deflated objects
    extra: int = 0  # of arrays: those under "extra/" (peer models, BN statistics...), not model tensors
    keys: frozenset[str] = frozenset()  # the model tensors it carries (extras not included)

    def __add__(self, other: Size) -> Size:
        return Size(
            self.arrays + other.arrays,
            self.proto + other.proto,
            self.wire + other.wire,
            self.extra + other.extra,
            self.keys | other.keys,
        )


def array_bytes(msg: Message, prefix: str = "") -> int:
    """Bytes of the message's arrays (those whose key starts with ``prefix``)."""
    if msg.has_error():
        return 0
    return sum(
        len(a.data) for rec in msg.content.array_records.values() for k, a in rec.items() if k.startswith(prefix)
    )


def measure(msg: Message) -> Size:
    """Size of ``msg`` as Flower serializes it (see the module docstring for what wire counts)."""
    wire = wire_measures()
    with wire.no_object_id_recompute():  # as Flower's push_messages: hash each object once
        if not msg.metadata.message_id:
            msg.metadata.__dict__["_message_id"] = msg.object_id  # what Flower's push_messages sets
        header = wire.message_to_proto(wire.remove_content_from_message(msg)).ByteSize()
        tree = wire.get_object_tree(msg).ByteSize()
        objects = sum(len(obj.deflate()) for obj in wire.get_all_nested_objects(msg).values())
    keys = (
        frozenset()
        if msg.has_error()
        else frozenset(
            k for rec in msg.content.array_records.values() for k in rec.keys() if not k.startswith(EXTRA_PREFIX)
        )
    )
    return Size(
        array_bytes(msg),
        wire.message_to_proto(msg).ByteSize(),
        header + tree + objects,
        array_bytes(msg, EXTRA_PREFIX),
        keys,
    )


@dataclass
class Batch:
    """One send_and_receive call: a discovery query, a training round or the final evaluation."""

    kind: str  # query | train | evaluate
    server_round: int | None
    down: list[Size] = field(default_factory=list)
    up: list[Size] = field(default_factory=list)


def counting_grid(num_nodes: int) -> Any:
    """A InProcessGrid that measures every message it delivers and every reply it returns."""
    local_grid = InProcessGrid

    class CountingGrid(local_grid):  # type: ignore[misc, valid-type]
        def __init__(self, n: int) -> None:
            super().__init__(n)
            self.batches: list[Batch] = []

        def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
            messages = list(messages)
            if not messages:
                return []
            first = messages[0]
            rnd = None
            if "config" in first.content.config_records and "server-round" in first.content.config_records["config"]:
                rnd = int(first.content.config_records["config"]["server-round"])
            batch = Batch(first.metadata.message_type, rnd)
            batch.down = [measure(m) for m in messages]  # before delivery: what left the server
            replies = list(super().send_and_receive(messages, timeout=timeout))
            batch.up = [measure(r) for r in replies]
            self.batches.append(batch)
            return replies

    return CountingGrid(num_nodes)


# ---------------------------------------------------------------------------- one method's run
def run_method(method: str, overrides: Sequence[str], rounds: int) -> dict[str, Any]:
    """Run ``method`` on the in-process grid; return its message batches and round records."""
    from pflower.server_app.run_plan import plan_run
    from pflower.server_app.runner import build, check_data
    from pflower.strategies import STRATEGIES, method_options

    args = {k: v for k, v in METHOD_ARGS.get(method, {}).items() if k in method_options(method)}
    # FedTSDP's server holds public data: a hold-out of the pool (the bytes per message do not depend on it)
    public = ["dataset.public=holdout"] if STRATEGIES[method].traits.needs_public_data else []
    with tempfile.TemporaryDirectory() as tmp:
        plan = plan_run(
            [
                *WORKLOAD,
                *public,
                *overrides,
                f"method={method}",
                f"rounds={rounds}",
                f"output_dir={tmp}",
                *(f"method.{k}={v}" for k, v in args.items()),
            ]
        )
        check_data(plan)
        strategy = build(plan, run_token=f"comm-{method}")
        grid = counting_grid(plan.run.num_clients)
        t0 = time.perf_counter()
        strategy.start(grid, num_rounds=rounds, timeout=plan.run.round_timeout)
        seconds = time.perf_counter() - t0
    return {
        "method": method,
        "batches": grid.batches,
        "history": [dict(r) for r in strategy.run.history],
        "clients_per_round": strategy.run.sample_size(),
        "num_clients": plan.run.num_clients,
        "seconds": seconds,
        "method_args": args,
        "group_keys": {g: list(strategy.model.schema().group_keys[g]) for g in strategy.model.groups},
        "model_params": int(sum(v.size for v in strategy.model.global_arrays.values())),
        "model_bytes": int(sum(v.nbytes for v in strategy.model.global_arrays.values())),
        "model": f"{plan.run.model} (fc_layers {next(iter(plan.archs.values())).get('fc_layers', '-')})",
        "dataset": plan.run.dataset,
    }


# ---------------------------------------------------------------------------- summarising
def check_accounting(run: dict[str, Any]) -> list[str]:
    """pflower's bytes_down/bytes_up against the arrays of the captured messages, per round."""
    problems = []
    train = {b.server_round: b for b in run["batches"] if b.kind == "train"}
    for rec in run["history"]:
        b = train.get(rec["round"])
        if b is None:
            problems.append(f"round {rec['round']}: no train messages captured")
            continue
        down, up = sum(s.arrays for s in b.down), sum(s.arrays for s in b.up)
        if rec["bytes_down"] != down:
            problems.append(f"round {rec['round']}: bytes_down {rec['bytes_down']} != {down} in the messages")
        if rec["bytes_up"] != up:
            problems.append(f"round {rec['round']}: bytes_up {rec['bytes_up']} != {up} in the replies")
    return problems


def segments(run: dict[str, Any]) -> list[tuple[str, list[int]]]:
    """Rounds grouped where the traffic changes: by the method's ``phase``; then, inside a phase,
    the first round apart when its per-client traffic differs from the phase's other rounds."""
    history = run["history"]
    per_client = {}
    for b in run["batches"]:
        if b.kind == "train" and b.down:
            per_client[b.server_round] = (
                round(sum(s.wire for s in b.down) / len(b.down)),
                round(sum(s.wire for s in b.up) / max(len(b.up), 1)),
            )
    groups: list[tuple[Any, list[int]]] = []
    for rec in history:
        phase = rec.get("phase")
        if groups and groups[-1][0] == phase:
            groups[-1][1].append(rec["round"])
        else:
            groups.append((phase, [rec["round"]]))
    out = []
    for phase, rnds in groups:
        label = "" if phase is None else (f"phase {phase}: " if isinstance(phase, int) else f"{phase}: ")
        first, rest = rnds[0], rnds[1:]
        if rest and _differs(per_client[first], [per_client[r] for r in rest]):
            out.append((f"{label}{_span([first])}", [first]))
            out.append((f"{label}{_span(rest)}", rest))
        else:
            out.append((f"{label}{_span(rnds)}", rnds))
    return out


def _differs(first: tuple[int, int], rest: list[tuple[int, int]], tol: float = 0.01) -> bool:
    ref = (median(r[0] for r in rest), median(r[1] for r in rest))
    return any(abs(a - b) > tol * max(b, 1) for a, b in zip(first, ref))


def _span(rounds: list[int]) -> str:
    return f"round {rounds[0]}" if len(rounds) == 1 else f"rounds {rounds[0]}-{rounds[-1]}"


def round_rows(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method and phase: medians over the phase's rounds."""
    rows = []
    ref = next((r for r in runs if r["method"] == REFERENCE), None)
    ref_down = ref_up = None
    if ref is not None:
        ref_rows = _phase_numbers(ref, [rd for _, rd in segments(ref)][-1])
        ref_down, ref_up = ref_rows["down_client"], ref_rows["up_client"]
    for run in runs:
        problems = check_accounting(run)
        for label, rnds in segments(run):
            n = _phase_numbers(run, rnds)
            rows.append(
                {
                    "method": run["method"],
                    "rounds": label,
                    "clients": f"{n['clients']:g}",
                    "tensors down / up": _travels(run, rnds),
                    "down MiB/client (msg min–max)": _with_range(n["down_client"], n["down_msg"]),
                    "up MiB/client (msg min–max)": _with_range(n["up_client"], n["up_msg"]),
                    "down MiB/round": f"{n['down_round'] / MIB:.3f}",
                    "up MiB/round": f"{n['up_round'] / MIB:.3f}",
                    f"down ×{REFERENCE}": _ratio(n["down_client"], ref_down),
                    f"up ×{REFERENCE}": _ratio(n["up_client"], ref_up),
                    "overhead KiB/msg down/up": f"{n['over_down'] / KIB:.2f} / {n['over_up'] / KIB:.2f}",
                    "pflower bytes = arrays": "yes" if not problems else "NO: " + "; ".join(problems[:2]),
                    "_raw": n,
                }
            )
    return rows


def _travels(run: dict[str, Any], rnds: list[int]) -> str:
    """What the phase's messages carry, from their array keys: model groups (all, all − g, g in
    part), tensors only some clients get, and extras (arrays that are not model tensors)."""
    train = [b for b in run["batches"] if b.kind == "train" and b.server_round in rnds]

    def side(sizes: list[Size]) -> str:
        if not sizes:
            return "-"
        common = frozenset.intersection(*(s.keys for s in sizes))
        union = frozenset.union(*(s.keys for s in sizes))
        text = describe_keys(common, run["group_keys"])
        if union != common:
            some = [g for g, ks in run["group_keys"].items() if set(ks) & (union - common)]
            text += f" (+{','.join(some)} to some)"
        if any(s.extra for s in sizes):
            text += " + extras"
        return text

    return f"{side([s for b in train for s in b.down])} / {side([s for b in train for s in b.up])}"


def describe_keys(keys: frozenset[str], group_keys: dict[str, list[str]]) -> str:
    """``all``, ``none``, ``all − classifier``, ``all (conv1,conv2 in part)`` or the groups present."""
    group_keys = {g: ks for g, ks in group_keys.items() if ks}  # a group without tensors (a pooling) never travels
    full = [g for g, ks in group_keys.items() if set(ks) <= keys]
    part = [g for g, ks in group_keys.items() if set(ks) & keys and not set(ks) <= keys]
    absent = [g for g in group_keys if g not in full and g not in part]
    if not full and not part:
        return "none"
    in_part = f" ({','.join(part)} in part)" if part else ""
    if not absent:
        return "all" + in_part
    if len(absent) <= len(group_keys) // 2:
        return "all − " + ",".join(absent) + in_part
    return ",".join(full) + in_part


def _phase_numbers(run: dict[str, Any], rnds: list[int]) -> dict[str, float]:
    """Medians over the rounds ``rnds`` of a run's train messages, each direction alike
    (``down_client``, ``up_round``, ``over_down``...)."""
    train = {b.server_round: b for b in run["batches"] if b.kind == "train"}
    bs = [train[r] for r in rnds if r in train]
    out: dict[str, Any] = {"clients": median(len(b.down) for b in bs)}
    for side in ("down", "up"):
        for key, value in _direction_numbers([getattr(b, side) for b in bs]).items():
            out[f"over_{side}" if key == "over" else f"{side}_{key}"] = value
    return out


def _direction_numbers(rounds: list[list[Any]]) -> dict[str, Any]:
    """One direction's messages, a list per round: per client, per message (min, max), per round
    (bytes on the wire, of arrays, of protocol), and each message's overhead over its arrays."""
    every = [s for msgs in rounds for s in msgs]
    return {
        "client": median(sum(s.wire for s in msgs) / max(len(msgs), 1) for msgs in rounds),
        "msg": (min((s.wire for s in every), default=0), max((s.wire for s in every), default=0)),
        "round": median(sum(s.wire for s in msgs) for msgs in rounds),
        "arrays_round": median(sum(s.arrays for s in msgs) for msgs in rounds),
        "proto_round": median(sum(s.proto for s in msgs) for msgs in rounds),
        "over": median(s.wire - s.arrays for s in every),
    }


def _with_range(value: float, span: tuple[int, int]) -> str:
    lo, hi = span[0] / MIB, span[1] / MIB
    same = f"{lo:.4f}" == f"{hi:.4f}"
    return f"{value / MIB:.4f}" + ("" if same else f" ({lo:.4f}–{hi:.4f})")


def _ratio(value: float, ref: float | None) -> str:
    if ref is None:
        return "n/a"
    if ref == 0:
        return "n/a"
    return f"{value / ref:.2f}"


def extras_rows(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per method whose messages carry extras (arrays that are not model tensors: Felo/Velo/FedHe's
    class knowledge, FedFomo's peer models, FedAP's BN statistics...), per phase: the median
    extras and model-tensor bytes per message and their ratio, and the extras against FedAvg's
    whole message (what the knowledge costs next to sending a model at all)."""
    ref = next((r for r in runs if r["method"] == REFERENCE), None)
    ref_msg = None
    if ref is not None:
        ref_msg = _phase_numbers(ref, [rd for _, rd in segments(ref)][-1])["down_client"]
    rows = []
    for run in runs:
        for label, rnds in segments(run):
            train = [b for b in run["batches"] if b.kind == "train" and b.server_round in rnds]
            # the messages that carry extras (Felo's warm-up round sends none down)
            down = [s for b in train for s in b.down if s.extra]
            up = [s for b in train for s in b.up if s.extra]
            if not down and not up:
                continue
            total = sum(len(b.down) + len(b.up) for b in train)
            ex_d, ex_u = median(s.extra for s in down) if down else 0, median(s.extra for s in up) if up else 0
            mod_d = median(s.arrays - s.extra for s in down) if down else 0
            mod_u = median(s.arrays - s.extra for s in up) if up else 0
            rows.append(
                {
                    "method": run["method"],
                    "rounds": label,
                    "msgs with extras": f"{len(down) + len(up)} of {total}",
                    "extras KiB/msg down / up": f"{ex_d / KIB:.2f} / {ex_u / KIB:.2f}",
                    "model tensors KiB/msg down / up": f"{mod_d / KIB:.1f} / {mod_u / KIB:.1f}",
                    "extras / model tensors down / up": f"{_share(ex_d, mod_d)} / {_share(ex_u, mod_u)}",
                    f"extras / {REFERENCE} message down / up": f"{_share(ex_d, ref_msg)} / {_share(ex_u, ref_msg)}",
                }
            )
    return rows


def _share(part: float, whole: float | None) -> str:
    if not whole:
        return "n/a"
    share = part / whole
    return f"{share:.2f}x" if share >= 1 else f"{100 * share:.3g}%"


def side_rows(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Discovery and final evaluation, per method: totals over all clients (not per round)."""
    rows = []
    for run in runs:
        query = Size(0, 0, 0)
        query_up = Size(0, 0, 0)
        nq = 0
        ev_down = ev_up = Size(0, 0, 0)
        ne = 0
        for b in run["batches"]:
            if b.kind == "query":
                nq += len(b.down)
                query = sum(b.down, query)
                query_up = sum(b.up, query_up)
            elif b.kind == "evaluate":
                ne += len(b.down)
                ev_down = sum(b.down, ev_down)
                ev_up = sum(b.up, ev_up)
        rows.append(
            {
                "method": run["method"],
                "query msgs": nq,
                "query KiB down/up": f"{query.wire / KIB:.1f} / {query_up.wire / KIB:.1f}",
                "final eval msgs": ne,
                "final eval MiB down": f"{ev_down.wire / MIB:.3f}",
                "final eval KiB up": f"{ev_up.wire / KIB:.1f}",
                "final eval KiB/client down": f"{ev_down.wire / max(ne, 1) / KIB:.1f}",
            }
        )
    return rows


def cross_check(runs: Sequence[dict[str, Any]]) -> str:
    """wire vs one-protobuf vs arrays over every train message of the run: the three agree up to overhead."""
    lines = []
    for run in runs:
        sizes = [s for b in run["batches"] if b.kind == "train" for s in (*b.down, *b.up)]
        if not sizes:
            continue
        over_wire = [s.wire - s.arrays for s in sizes]
        over_proto = [s.proto - s.arrays for s in sizes]
        lines.append(
            {
                "method": run["method"],
                "train msgs": len(sizes),
                "arrays MiB": f"{sum(s.arrays for s in sizes) / MIB:.3f}",
                "wire MiB": f"{sum(s.wire for s in sizes) / MIB:.3f}",
                "proto MiB": f"{sum(s.proto for s in sizes) / MIB:.3f}",
                "wire - arrays per msg, B (min..max)": f"{min(over_wire)}..{max(over_wire)}",
                "proto - arrays per msg, B (min..max)": f"{min(over_proto)}..{max(over_proto)}",
                "s": f"{run['seconds']:.1f}",
            }
        )
    return markdown_table(lines, list(lines[0]) if lines else [])


ROUND_COLUMNS = [
    "method",
    "rounds",
    "clients",
    "tensors down / up",
    "down MiB/client (msg min–max)",
    "up MiB/client (msg min–max)",
    "down MiB/round",
    "up MiB/round",
    f"down ×{REFERENCE}",
    f"up ×{REFERENCE}",
    "overhead KiB/msg down/up",
    "pflower bytes = arrays",
]
SIDE_COLUMNS = [
    "method",
    "query msgs",
    "query KiB down/up",
    "final eval msgs",
    "final eval MiB down",
    "final eval KiB/client down",
    "final eval KiB up",
]


# ---------------------------------------------------------------------------- command line
def all_methods() -> list[str]:
    from pflower.strategies import STRATEGIES

    names = sorted(STRATEGIES)
    return [REFERENCE] + [n for n in names if n != REFERENCE]


def benchmark(
    methods: Sequence[str], rounds: int, overrides: Sequence[str], progress: bool = True
) -> list[dict[str, Any]]:
    runs = []
    if REFERENCE not in methods:
        methods = [REFERENCE, *methods]  # the ratios need FedAvg from the same run
    for i, method in enumerate(methods, 1):
        run = run_method(method, overrides, rounds)
        runs.append(run)
        if progress:
            print(f"[{i}/{len(methods)}] {method}: {run['seconds']:.1f}s", flush=True)
    return runs


def report(runs: Sequence[dict[str, Any]], command: str, started: float, rounds: int, overrides: Sequence[str]) -> str:
    import torch

    load = os.getloadavg()[0]
    shared = ": other jobs shared the cores" if load > 1.5 else ""
    first = runs[0]
    problems = {r["method"]: check_accounting(r) for r in runs}
    bad = {m: p for m, p in problems.items() if p}
    args = ", ".join(f"{m}: {a}" for m, a in ((r["method"], r["method_args"]) for r in runs) if a)
    parts = [
        "# Communication per round, every method, from the actual messages",
        "",
        run_header(command, started),
        f"Workload: `{' '.join([*WORKLOAD, *overrides])}`, {rounds} rounds, {first['num_clients']} clients, "
        f"{first['clients_per_round']} per round; method options: {args or 'defaults'}.  ",
        f"Model: {first['model']} on {first['dataset']}, {first['model_params']:,} trainable parameters = "
        f"{first['model_bytes'] / MIB:.4f} MiB of float32 (BN running statistics never travel).  ",
        f"Runtime: {time.perf_counter() - started:.0f} s for {len(runs)} methods (torch threads "
        f"{torch.get_num_threads()}; "
        f"1-min load average at the end {load:.1f} on {os.cpu_count()} cores{shared}).",
        "",
        "## Training rounds",
        "",
        "Wire bytes per message as Flower 1.41 transports it (message header + object tree + deflated",
        "objects). MiB/client = median over the rounds of the mean per client; MiB/round = median of the",
        f"round's total. Ratios: per client against {REFERENCE}'s, measured in this run. Overhead = wire -",
        "array bytes per message (config spec, metrics, metadata, object headers). The last column checks",
        "that pflower's `bytes_down`/`bytes_up` equal the array bytes of the captured messages every round.",
        "",
        markdown_table(round_rows(runs), ROUND_COLUMNS),
        "",
        *_extras_section(runs),
        "## Discovery and final evaluation (once per run, totals)",
        "",
        markdown_table(side_rows(runs), SIDE_COLUMNS),
        "",
        "## Cross-check: wire vs one protobuf vs array bytes (all training messages of the run)",
        "",
        cross_check(runs),
        "",
        _notes(runs),
        "",
        "Accounting: "
        + (
            "pflower's bytes_down/bytes_up equal the captured messages' array bytes in every round of every method."
            if not bad
            else "MISMATCHES: " + "; ".join(f"{m}: {p[:3]}" for m, p in bad.items())
        ),
    ]
    return "\n".join(parts)


EXTRAS_COLUMNS = [
    "method",
    "rounds",
    "msgs with extras",
    "extras KiB/msg down / up",
    "model tensors KiB/msg down / up",
    "extras / model tensors down / up",
    f"extras / {REFERENCE} message down / up",
]


def _extras_section(runs: Sequence[dict[str, Any]]) -> list[str]:
    rows = extras_rows(runs)
    if not rows:
        return []
    return [
        "## Extras against the model (arrays that are not model tensors)",
        "",
        "Array bytes per message, medians over the phase's messages that carry extras: the extras (Felo/Velo: class",
        "features S, logits P and mask M down, s, p, n up; FedHe: logits only; FedFomo/FedAMP: peer or",
        "mixed models; FedAP: BN statistics) against the model tensors of the same message, and against",
        f"{REFERENCE}'s whole message on the wire. Felo and Velo's warm-up round sends no knowledge down.",
        "",
        markdown_table(rows, EXTRAS_COLUMNS),
        "",
    ]


def _notes(runs: Sequence[dict[str, Any]]) -> str:
    """Method state that decides the traffic (FedCMD's l*), from the last round's record."""
    notes = [
        f"{r['method']} personal layer l* = {r['history'][-1]['personal_layer']}"
        for r in runs
        if r["history"] and r["history"][-1].get("personal_layer")
    ]
    return "Method state: " + "; ".join(notes) + "." if notes else ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.communication", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="training rounds per method (default 6)")
    parser.add_argument("--methods", default="all", help="comma-separated methods (default: every registered one)")
    parser.add_argument("--quick", action="store_true", help="synthetic data, 6 clients: a seconds-long smoke run")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: LeNet batches gain little from more)"
    )
    parser.add_argument(
        "--output", default="benchmarks/results/communication.md", help="result file ('' to only print)"
    )
    parser.add_argument("overrides", nargs="*", help="extra config overrides, e.g. model=cnn_fedtsdp dataset=cifar10")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    methods = all_methods() if args.methods == "all" else [m.strip() for m in args.methods.split(",") if m.strip()]
    overrides = [*(QUICK if args.quick else []), *args.overrides]
    started = time.perf_counter()
    runs = benchmark(methods, args.rounds, overrides)
    command = "python -m benchmarks.communication " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(runs, command, started, args.rounds, overrides)
    print(text)
    if args.output:
        print(f"\nwritten to {write_result(args.output, text)}")
    return 0 if all(not check_accounting(r) for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
