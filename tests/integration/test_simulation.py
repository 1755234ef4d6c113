"""Real Flower simulations: the `pflower sim` CLI (hydra multirun) and `flwr run .`."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SMALL = ["num_clients=4", "rounds=2", "local_epochs=1", "fraction=0.5", "partition.min_size=20", "alpha=1.0"]

pytestmark = pytest.mark.slow


def run_dirs(out: Path) -> dict[str, Path]:
    """'<HH-MM-SS>-<method>-<dataset>[-N]' directories by '<method>-<dataset>'."""
    return {re.sub(r"-\d+$", "", p.name.split("-", 3)[3]): p for p in out.glob("*/*") if p.is_dir()}


def check_run_dir(run: Path, rounds: int) -> list[dict]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["round"] for x in lines] == list(range(1, rounds + 1))
    summary = json.loads((run / "summary.json").read_text())
    assert 0.0 <= summary["headline_test_before_acc"] <= 1.0 and summary["final_clients"] > 0
    assert len(summary["data_sha256"]) == 64 and summary["data_dir"]  # the data it read, recorded
    assert (run / "config.yaml").exists() and (run / "accuracy.png").stat().st_size > 1000
    return lines


def test_pflower_sim_sweep_runs_fedavg_and_fedper_under_ray(tmp_path):
    """Two Ray simulations one after the other in one process (Local's zero bytes: the unit
    test test_local_communicates_nothing; a third Ray start cost two minutes of CI)."""
    out = tmp_path / "outputs"
    cmd = [str(BIN / "pflower"), "sim", "-m", "method=fedavg,fedper", f"output_dir={out}", *SMALL, "backend=ray"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = run_dirs(out)
    assert set(runs) == {"fedavg-digits", "fedper-digits"}, runs
    log = proc.stdout + proc.stderr  # Flower's round lines and pflower's progress lines reach the terminal
    assert "[round   2/2]" in log and "progress: run 2/2 (method=fedper) | round 2/2" in log, log[-3000:]
    fedavg = check_run_dir(runs["fedavg-digits"], 2)
    fedper = check_run_dir(runs["fedper-digits"], 2)
    assert all(r["groups_down"] == ["conv1", "conv2", "fc1", "fc2", "classifier"] for r in fedavg)
    # FedPer: the classifier never travels, either way
    assert all(r["groups_down"] == r["groups_up"] == ["conv1", "conv2", "fc1", "fc2"] for r in fedper)
    assert all(p["bytes_down"] < a["bytes_down"] for p, a in zip(fedper, fedavg))


TIMING_KEYS = {
    "round_time_s",
    "client_train_s",
    "client_eval_s",
    "server_s",
    "wall_time_s",
    "mean_round_time_s",
    "client_eval_share",
}


def without_timings(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING_KEYS and not k.endswith("_s")}


def test_a_ray_run_and_a_serial_run_with_the_same_seed_write_the_same_numbers(tmp_path):
    """Under Ray the replies arrive in a different order each run; the server sums them in
    client-id order, so the numbers depend on the seed and config only. FedAvg, and pFedSim,
    whose server keeps per-client bodies and a similarity matrix between rounds. The serial
    backend (every client in this process, no Ray, replies in client-id order) writes the same
    numbers as Ray, which also shows the Ray run did not depend on its arrival order (a second
    Ray run used to be compared too: a minute of CI for what this equality already covers)."""
    records = []
    for attempt in ("ray", "serial"):
        out = tmp_path / attempt
        backend = [f"backend={attempt}"]
        cmd = [
            str(BIN / "pflower"),
            "sim",
            "-m",
            "method=fedavg,pfedsim",
            f"output_dir={out}",
            *SMALL,
            "fraction=1.0",
            *backend,
        ]
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs = run_dirs(out)
        records.append(
            {m: [without_timings(r) for r in check_run_dir(runs[f"{m}-digits"], 2)] for m in ("fedavg", "pfedsim")}
        )
        summaries = {
            m: without_timings(json.loads((runs[f"{m}-digits"] / "summary.json").read_text()))
            for m in ("fedavg", "pfedsim")
        }
        records[-1]["summaries"] = [{k: v for k, v in s.items() if k != "run_dir"} for s in summaries.values()]
    assert records[1] == records[0]
    assert records[0]["pfedsim"][-1]["phase"] == "personal"  # the server's state was in play


def test_pflower_sim_runs_a_federation_of_three_architectures(tmp_path):
    """model=mixed under Flower's simulation engine: each client trains its own architecture and
    FedAvg averages only clients of the same one (metrics per architecture in every record)."""
    out = tmp_path / "outputs"
    cmd = [
        str(BIN / "pflower"),
        "sim",
        "method=fedavg",
        "model=mixed",
        "num_clients=6",
        "fraction=1.0",
        "backend=ray",
        f"output_dir={out}",
        *[o for o in SMALL if not o.startswith(("num_clients", "fraction"))],
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = check_run_dir(run_dirs(out)["fedavg-digits"], 2)
    archs = ("lenet5_1fc", "lenet5_3fc", "cnn_kapc")
    assert all(f"test_before_acc@{a}" in r for r in lines for a in archs)
    summary = json.loads((run_dirs(out)["fedavg-digits"] / "summary.json").read_text())
    assert all(0.0 <= summary[f"final_acc@{a}"] <= 1.0 for a in archs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_flwr_run_dot(tmp_path):
    """`flwr run .` through a local SuperLink of its own (own FLWR_HOME and ports), stopped afterwards;
    on that SuperLink, a second checkout's run is refused and `pflower run` gives it its own
    (:func:`second_checkout_is_refused_and_pflower_run_gives_it_its_own`: one SuperLink started from
    this checkout serves both checks)."""
    out = tmp_path / "outputs"
    env = {
        **os.environ,
        "FLWR_HOME": str(tmp_path / "flwr-home"),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    run_config = " ".join(
        ["method='fedavg'", *SMALL[:4], f"output_dir='{out}'", "overrides='partition.min_size=20 alpha=1.0'"]
    )
    cmd = [
        "flwr",
        "run",
        ".",
        "--stream",
        "--run-config",
        run_config,
        "--federation-config",
        "num-supernodes=4 client-resources-num-cpus=1",
    ]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log[-4000:]
        assert "pflower summary" in log and "[round   2/2]" in log and "progress: round 2/2" in log
        runs = run_dirs(out)
        assert list(runs) == ["fedavg-digits"], log[-3000:]
        check_run_dir(runs["fedavg-digits"], 2)

        # a bad value: one `pflower:` line in the streamed log, no traceback, the run marked failed, no run directory
        bad = [
            "flwr",
            "run",
            ".",
            "--stream",
            "--run-config",
            f"method='nosuch' output_dir='{out}'",
            "--federation-config",
            "num-supernodes=4",
        ]
        proc = subprocess.run(bad, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        log = proc.stdout + proc.stderr
        assert "pflower: unknown method 'nosuch'; valid:" in log and "Traceback" not in log, log[-3000:]
        listed = subprocess.run(
            ["flwr", "ls", "--format", "json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        statuses = [r["status"] for r in json.loads(listed.stdout)["runs"]]
        assert sorted(statuses) == ["finished:completed", "finished:failed"], listed.stdout
        assert list(run_dirs(out)) == ["fedavg-digits"]

        # a second checkout against this SuperLink (started from ROOT), and `pflower run` there
        if (ROOT / ".git").exists():  # copy_repository needs the git checkout (git ls-files)
            second_checkout_is_refused_and_pflower_run_gives_it_its_own(tmp_path, env, out)

        # `pflower superlink status|stop` find this FLWR_HOME's SuperLink and its working directory, stop only it
        pflower = str(BIN / "pflower")
        status = subprocess.run(
            [pflower, "superlink", "status"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert (
            f"Control API 127.0.0.1:{env['FLWR_LOCAL_CONTROL_API_PORT']}" in status.stdout
            and f"working directory {ROOT} " in status.stdout
        ), status.stdout
        stopped = subprocess.run(
            [pflower, "superlink", "stop"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert stopped.returncode == 0 and stopped.stdout.startswith("stopped the local SuperLink"), stopped.stdout
        after = subprocess.run(
            [pflower, "superlink", "status"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert after.stdout.startswith("no local SuperLink of"), after.stdout
    finally:
        stop_local_superlink(env)


def second_checkout_is_refused_and_pflower_run_gives_it_its_own(tmp_path: Path, env: dict, out: Path) -> None:
    """Issue 43, items 2 and 3, on the local SuperLink ``env`` started from this checkout: `flwr run .`
    from a second checkout whose code differs is refused with the fix (the run marked failed, `flwr
    run` still exits 0); `pflower run` there runs through a SuperLink of its own and exits with the
    run's status."""
    from pflower.server_app.superlink import local_superlinks

    env = {**env, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    from repo_copy import copy_repository

    second = copy_repository(tmp_path / "second")
    with (second / "strategies" / "fedper.py").open("a") as f:
        f.write("# the second checkout's branch\n")
    quick = ["--run-config", f"method='nosuch' output_dir='{out}'", "--federation-config", "num-supernodes=4"]
    try:
        proc = subprocess.run(
            ["flwr", "run", ".", "--stream", *quick], cwd=second, env=env, capture_output=True, text=True, timeout=600
        )
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log[-3000:]  # Flower's status says nothing of the run
        assert (
            f"this local SuperLink was started from another checkout ({ROOT}" in log and "strategies/fedper.py" in log
        ), log[-3000:]
        assert "unknown method" not in log  # refused before the config is read
        run_config = " ".join(
            [
                "method='fedavg'",
                "num_clients=4",
                "rounds=1",
                "local_epochs=1",
                f"output_dir='{out}'",
                "overrides='partition.min_size=20 alpha=1.0'",
            ]
        )
        ok = subprocess.run(
            [
                str(BIN / "pflower"),
                "run",
                "--run-config",
                run_config,
                "--federation-config",
                "num-supernodes=4 client-resources-num-cpus=1",
            ],
            cwd=second,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert ok.returncode == 0 and "finished:completed" in ok.stdout, (ok.stdout + ok.stderr)[-3000:]
        bad = subprocess.run(
            [str(BIN / "pflower"), "run", *quick], cwd=second, env=env, capture_output=True, text=True, timeout=600
        )
        assert bad.returncode == 1 and "finished:failed" in bad.stderr, (bad.stdout + bad.stderr)[-3000:]
    finally:
        from pflower.server_app.superlink import stop

        for s in local_superlinks():  # the second checkout's own, under this test's cache
            if s.flwr_home is not None and s.flwr_home.resolve().is_relative_to((tmp_path / "cache").resolve()):
                stop(s)


def stop_local_superlink(env: dict[str, str]) -> None:
    """The local SuperLink outlives `flwr run`: stop the one this test started (its FLWR_HOME and port)."""
    from pflower.server_app.superlink import local_superlinks, mine, stop

    for superlink in mine(local_superlinks(), Path(env["FLWR_HOME"]).resolve(), env["FLWR_LOCAL_CONTROL_API_PORT"]):
        stop(superlink)
