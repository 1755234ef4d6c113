"""Start-up: where the seconds before round 1 of ``pflower sim`` go (issue 62, item 1).

Each measurement is a fresh interpreter, as a user's command is:

* **interpreter**: ``python -c pass``; **torch**: ``python -c "import torch"`` (the floor the
  target is stated against).
* **pflower sim**: the README's default experiment (``pflower sim``, FedCMD on digits, the
  parallel engine) with ``rounds=1``, run by :func:`traced_sim` in a child process that calls
  the same entry point as the ``pflower`` command (``pflower.cli.main``) with timers around the
  steps it takes: importing pflower's CLI, composing and validating the config (every hydra
  composition counted), reading and partitioning the data, building the strategy and its model,
  starting the engine, discovering the clients, and round 1 itself. The timers wrap functions
  from outside (no line of pflower changes for the benchmark); a step's seconds include the
  imports it triggers.
* **imports**: one more run under ``python -X importtime``: the top-level packages that cost the
  most, cumulative.

Seconds are medians over ``--repeats`` runs. The target (issue 62): round 1 starts within
torch's import + 2 s. Run: ``python -m benchmarks.startup [--repeats 3] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, markdown_table, median, publish, run_header

SIM_ARGS = ["sim", "progress=false"]

# (step, "module:attribute" of the function timed; a class attribute as "module:Class.method")
STEPS = (
    ("config (hydra compose + validate)", "hydra._internal.config_loader_impl:ConfigLoaderImpl.load_configuration"),
    ("config (hydra compose + validate)", "pflower.server_app.config:validate"),
    ("data (read + partition check)", "pflower.server_app.runner:check_data"),
    ("strategy and model", "pflower.server_app.runner:build"),
    ("engine start", "pflower.simulation.parallel:ParallelGrid.__init__"),
    ("discovery", "pflower.strategies.base.strategy:PersonalizedStrategy.discover"),
)


def _timed(record: dict[str, list[float]], step: str, fn):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            record[step].append(time.perf_counter() - t)

    return wrapper


def traced_sim(out_dir: str, extra: list[str], result_file: str) -> None:
    """In this (fresh) process: ``pflower sim`` with timers; writes the seconds of each step, and
    when round 1 began and ended (counted from the launch), to ``result_file`` and ends the
    process when round 1 has ended (the rest of the run is not start-up)."""
    import importlib

    start = float(os.environ["STARTUP_T0"])  # wall clock just before the interpreter was launched
    cli = importlib.import_module("pflower.cli")
    record: dict[str, list[float]] = defaultdict(list)
    for step, target in STEPS:
        module_name, attr = target.split(":")
        owner: Any = importlib.import_module(module_name)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        wrapped = _timed(record, step, getattr(owner, name))
        setattr(owner, name, wrapped)
        if target == "pflower.server_app.config:validate":  # simulation.sim_command holds its own reference
            importlib.import_module("pflower.simulation.sim_command").validate = wrapped
    from pflower.strategies.base.strategy import PersonalizedStrategy

    # the modules the run imports, loaded here (to wrap them) rather than on first use
    import_seconds = time.time() - start
    marks: dict[str, float] = {}
    configure, aggregate = PersonalizedStrategy.configure_train, PersonalizedStrategy.aggregate_train

    def first_configure(self, server_round, *args, **kwargs):
        marks.setdefault("round 1 began", time.time() - start)
        return configure(self, server_round, *args, **kwargs)

    def first_aggregate(self, server_round, *args, **kwargs):
        aggregate(self, server_round, *args, **kwargs)
        marks["round 1 ended"] = time.time() - start
        result = {"interpreter + imports (pflower's modules, torch, flwr, hydra)": import_seconds}
        result.update({step: sum(values) for step, values in record.items()})
        result.update(marks)
        Path(result_file).write_text(json.dumps(result))
        os._exit(0)  # the engine's workers are forked children: they end with this process

    PersonalizedStrategy.configure_train = first_configure
    PersonalizedStrategy.aggregate_train = first_aggregate
    code = cli.main([*SIM_ARGS, f"output_dir={out_dir}", *extra])
    raise SystemExit(f"pflower sim exited {code} before round 1 ended")


def fresh(code: str) -> float:
    """Seconds of ``python -c code`` from launch to exit."""
    t = time.time()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.time() - t


def one_sim(extra: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        code = (
            "from benchmarks.startup import traced_sim; "
            f"traced_sim({str(Path(tmp) / 'runs')!r}, {extra!r}, {str(out)!r})"
        )
        env = {**os.environ, "STARTUP_T0": repr(time.time())}
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"the traced pflower sim failed:\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


THIRD_PARTY = (
    "torch",
    "torchvision",
    "flwr",
    "hydra",
    "omegaconf",
    "numpy",
    "scipy",
    "sklearn",
    "matplotlib",
    "grpc",
    "ray",
)


def top_imports(extra: list[str]) -> list[dict[str, Any]]:
    """What importing each big third-party package cost in a ``pflower sim`` run (``-X importtime``:
    the cumulative time of the package's own line, where it was first imported; absent: never)."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "pflower.cli", *SIM_ARGS, f"output_dir={tmp}", *extra],
            capture_output=True,
            text=True,
        )
    cost: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        parts = line.split("|")
        if line.startswith("import time:") and len(parts) == 3 and parts[1].strip().isdigit():
            name = parts[2].strip()
            if name in THIRD_PARTY:
                cost[name] = int(parts[1]) / 1e6
    return [
        {"package": name, "seconds": f"{cost[name]:.2f}" if name in cost else "not imported"} for name in THIRD_PARTY
    ]


ROUND_LINE = re.compile(r"\[round\s+1/\d+\].*\| (\d+(?:\.\d+)?)s(?: \||$)")
RUN_MARKS = (  # (a line of `pflower run`'s stream, the moment it marks)
    ("Successfully started run", "run accepted (flwr CLI, FAB, local SuperLink)"),
    ("pflower run directory", "ServerApp up (its run directory made)"),
)


def one_pflower_run(config: str, cold: bool) -> dict[str, float]:
    """``pflower run`` from this checkout to its round 1, seconds from launch to each mark of its
    stream; ``cold``: this checkout's local SuperLink stopped first (the first run of a session)."""
    if cold:
        subprocess.run([sys.executable, "-m", "pflower.cli", "superlink", "stop"], cwd=REPO, capture_output=True)
    t = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pflower.cli", "run", "--run-config", config],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    marks: dict[str, float] = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.time() - t
        for text, mark in RUN_MARKS:
            if text in line:
                marks.setdefault(mark, now)
        found = ROUND_LINE.search(line)
        if found and "round 1 ended" not in marks:
            marks["round 1 ended"] = now
            marks["round 1 began"] = now - float(found.group(1))
    if proc.wait() != 0 or "round 1 ended" not in marks:
        raise SystemExit(f"pflower run failed (status {proc.returncode}); marks so far: {marks}")
    return marks


def pflower_run_table(repeats: int, config: str) -> str:
    """Cold and warm ``pflower run`` (README's second way to run), medians of ``repeats`` each."""
    runs = {kind: [one_pflower_run(config, cold=kind == "cold") for _ in range(repeats)] for kind in ("cold", "warm")}
    steps = [mark for _, mark in RUN_MARKS] + ["round 1 began", "round 1 ended"]
    rows = [
        {"moment (seconds from launch)": step, **{kind: f"{median(r[step] for r in runs[kind]):.1f}" for kind in runs}}
        for step in steps
    ]
    return markdown_table(rows, ["moment (seconds from launch)", "cold", "warm"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the Markdown here (default: print it)")
    parser.add_argument(
        "--pflower-run",
        metavar="RUN_CONFIG",
        default=None,
        help="also time `pflower run --run-config RUN_CONFIG` to its round 1, cold and warm",
    )
    parser.add_argument("overrides", nargs="*", help="extra pflower sim overrides (default: the README's run)")
    args = parser.parse_args(argv)
    started = time.time()
    interpreter = [fresh("pass") for _ in range(args.repeats)]
    torch_import = [fresh("import torch") for _ in range(args.repeats)]
    sims = [one_sim(args.overrides) for _ in range(args.repeats)]
    steps = [k for k in sims[0] if k not in ("round 1 began", "round 1 ended")]
    rows = [
        {"step": "interpreter (`python -c pass`)", "seconds": f"{median(interpreter):.2f}"},
        {"step": "torch alone (`python -c 'import torch'`)", "seconds": f"{median(torch_import):.2f}"},
    ]
    rows += [{"step": f"pflower sim: {s}", "seconds": f"{median(r.get(s, 0.0) for r in sims):.2f}"} for s in steps]
    began = median(r["round 1 began"] for r in sims)
    ended = median(r["round 1 ended"] for r in sims)
    rows += [
        {"step": "**round 1 began** (from launch)", "seconds": f"**{began:.2f}**"},
        {"step": "round 1 ended", "seconds": f"{ended:.2f}"},
    ]
    gap = began - median(torch_import)
    lines = [
        run_header("python -m benchmarks.startup " + " ".join(argv or sys.argv[1:]), started),
        "",
        f"`pflower sim {' '.join(SIM_ARGS[1:] + args.overrides)}`, medians of {args.repeats} fresh processes each.",
        "",
        markdown_table(rows, ["step", "seconds"]),
        "",
        f"Round 1 began {gap:.2f} s after torch's import time (target: 2 s or less).",
        "",
        "What importing each big package cost inside the run (one `-X importtime` run, cumulative):",
        "",
        markdown_table(top_imports(args.overrides), ["package", "seconds"]),
    ]
    if args.pflower_run:
        lines += [
            "",
            f'`pflower run --run-config "{args.pflower_run}"` (a local SuperLink, Flower\'s simulation runtime):',
            "cold: this checkout's SuperLink stopped before each run; warm: left running from the run before.",
            f"Medians of {args.repeats} runs each.",
            "",
            pflower_run_table(args.repeats, args.pflower_run),
        ]
    publish("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
