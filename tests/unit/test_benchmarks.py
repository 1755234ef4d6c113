"""benchmarks/server_scaling.py on tiny sizes: every case runs and every registered method is covered."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ is a folder of the checkout, not an installed package

from benchmarks import server_scaling as ss  # noqa: E402
from pflower.strategies import STRATEGIES  # noqa: E402


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_quick_run_times_every_case_at_every_size(capsys):
    results = ss.main(["--quick"])  # LeNet-5, n = 2 and 4, one round each, nothing written
    assert [(r["strategy"], r["model"], r["n"]) for r in results] == [
        (c, "lenet5", n) for c in ss.CASES for n in (2, 4)
    ]
    failed = [r for r in results if r["status"] != "ok"]
    assert not failed, failed
    assert all(r["total_s"] > 0 and r["runs"] == 1 and r["input_bytes"] > 0 for r in results)
    out = capsys.readouterr().out
    for name in ss.CASES:  # the printed table has a row per case and size, ratios on the second
        assert f"| {name} | lenet5 | 2 |" in out and f"| {name} | lenet5 | 4 |" in out
    rows = ss.rows_of(results)
    assert all(r["time x"] for r in rows if r["n"] == 4) and "Total wall time" in out
    for method in STRATEGIES:  # every registered method appears: its own row, or named as costing a FedAvg
        assert method in out


def test_every_method_with_its_own_server_math_has_a_case(monkeypatch):
    cased = {c.method for c in ss.CASES.values()}
    assert cased <= set(STRATEGIES)
    assert set(STRATEGIES) - set(ss.base_math_methods()) <= cased
    assert "fedavg" in cased
    # a new method with its own aggregate needs no line: it gets a default case
    from pflower.strategies.fedavg import FedAvg

    class NewMethod(FedAvg):
        name = "newmethod"

        def aggregate(self, server_round, updates):
            return super().aggregate(server_round, updates)

    monkeypatch.setitem(STRATEGIES, "newmethod", NewMethod)
    cases = ss.with_default_cases(ss.TUNED_CASES)
    assert cases["newmethod"] == ss.case("newmethod") and "newmethod" not in ss.TUNED_CASES


def test_exponent_fit_and_skip_over_budget():
    assert abs(ss.exponent([(10, 1.0), (100, 100.0), (1000, 10000.0)]) - 2.0) < 1e-9
    res = ss.benchmark(
        ["fedavg"], ["resnet18"], [1000], repeats=1, budget=2**30, case_seconds=1, timeout=10, progress=False
    )
    assert res[0]["status"] == "skipped" and "inputs need 41.7 GiB" in res[0]["reason"]


def test_batched_profile_prints_training_and_evaluation_tables(capsys):
    from benchmarks import batched_profile

    assert (
        batched_profile.main(
            ["--clients", "2", "--samples", "32", "--test-samples", "40", "--repeats", "1", "--out", ""]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "| batched (vmap) |" in text and "| together (vmap) |" in text
    assert "the time per client-step" in text and "the time per client." in text


@pytest.mark.heavy  # fresh processes, each importing torch
def test_the_startup_benchmark_times_every_step_before_round_1(capsys):
    from benchmarks import startup

    assert startup.main(["--repeats", "1", "method=fedavg", "rounds=2"]) == 0
    out = capsys.readouterr().out
    for step in ("interpreter", "torch alone", "config (hydra compose", "data (read", "engine start", "discovery"):
        assert step in out, step
    began = float(out.split("**round 1 began** (from launch) | **")[1].split("**")[0])
    assert 0 < began < 120 and "| torch |" in out and "| sklearn | not imported |" in out


@pytest.mark.slow  # 4 pflower sim commands (ResNet-18 among them): about 25 s on 2 cores
def test_the_gpu_run_works_on_cpu_as_a_smoke_run(capsys):
    """benchmarks/gpu_run.py, the command prepared for a lent GPU: every case type runs here on the
    CPU (the batched engine's two workloads and both 3-seed sweeps) and lands in its one table."""
    from benchmarks import gpu_run

    assert [c[:2] for c in gpu_run.cases(False, 10, 3)] == [
        (w, e) for w in ("LeNet-5, FMNIST", "ResNet-18, FMNIST") for e in ("serial", "parallel", "batched")
    ]
    assert gpu_run.main(["--smoke", "--only", "batched"]) == 0
    out = capsys.readouterr().out
    for row in (
        "| LeNet-5, digits | batched | 1 |",
        "| ResNet-18, digits | batched | 1 |",
        "| 3 seeds, one after the other (serial) | 1 |",
        "| 3 seeds, --together (batched) | 1 |",
    ):
        assert row in out, row
