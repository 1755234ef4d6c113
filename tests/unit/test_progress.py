"""Progress lines of a run and of a `pflower sim -m` sweep: the ETA math, the text, the runner's use."""

from __future__ import annotations

import pytest

from pflower.server_app.progress import RunProgress, Sweep, bar, eta, format_duration, job_label, sweep_eta


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0:00"),
        (59.6, "1:00"),
        (61, "1:01"),
        (3599, "59:59"),
        (3661, "1:01:01"),
        (None, "?"),
        (-1, "?"),
        (float("nan"), "?"),
    ],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_eta_assumes_the_rate_so_far():
    assert eta(10.0, 2, 10) == 40.0
    assert eta(10.0, 0, 10) is None  # no rate before the first round
    assert eta(10.0, 10, 10) == 0.0


def test_sweep_eta_adds_the_runs_still_to_start():
    # the current run: 30 s left of a projected 60 s; one run finished in 100 s; 2 runs after this one
    assert sweep_eta(30.0, 60.0, [100.0], 2) == 30.0 + 2 * 80.0
    assert sweep_eta(30.0, 60.0, [], 2) == 30.0 + 2 * 60.0
    assert sweep_eta(30.0, 60.0, [100.0], 0) == 30.0  # the last run
    assert sweep_eta(None, None, [100.0], 2) is None


def test_bar():
    assert bar(0.0, 10) == "[..........]"
    assert bar(0.57, 10) == "[#####.....]"
    assert bar(1.0, 10) == "[##########]"
    assert bar(1.5, 4) == "[####]"


def test_run_progress_line():
    clock = Clock()
    p = RunProgress(30, clock=clock)
    clock.t += 41.0
    assert p.line(17) == "progress: round 17/30 [###########.........]  57% | elapsed 0:41 | ETA 0:31"


def test_start_up_before_round_one_is_not_a_round():
    clock = Clock()
    p = RunProgress(10, clock=clock)
    clock.t += 20.0  # 18 s discovering clients (starting the simulation's workers), then a 2 s round
    assert p.line(1, round_time=2.0).endswith("elapsed 0:20 | ETA 0:18")
    clock.t += 3.0
    assert p.line(2, round_time=2.5).endswith("elapsed 0:23 | ETA 0:20")  # (2 + 3) s for 2 rounds, 8 left


def test_resumed_run_times_only_its_own_rounds():
    clock = Clock()
    p = RunProgress(10, first_round=6, clock=clock)  # rounds 1-5 ran before the restart
    clock.t += 20.0
    assert p.line(7).endswith("elapsed 0:20 | ETA 0:30")  # 2 rounds in 20 s, 3 left


def test_sweep_progress_line():
    clock = Clock()
    sweep = Sweep(3, ["method"], clock=clock)
    sweep.start_job(0, "method=fedavg")
    clock.t += 100.0
    sweep.end_job()
    sweep.start_job(1, "method=fedper")
    clock.t += 5.0  # simulation start-up: counted in the run's duration, not in its rounds
    p = RunProgress(10, sweep=sweep, clock=clock)
    clock.t += 20.0
    line = p.line(5)
    # run: 20 s for 5 rounds -> 20 s left, projected 25 + 20 = 45 s; sweep: 20 + 1 * mean(100, 45) = 92.5 s
    assert line == (
        "progress: run 2/3 (method=fedper) | round 5/10 [##########..........]  50% | run 0:20, ETA 0:20"
        " | sweep 2:05, ETA 1:32"
    )


def test_sweep_of_unknown_size_shows_the_run_number_only():
    clock = Clock()
    sweep = Sweep(None, clock=clock)
    sweep.start_job(4)
    p = RunProgress(2, sweep=sweep, clock=clock)
    clock.t += 3.0
    assert p.line(1) == "progress: run 5 | round 1/2 [##########..........]  50% | run 0:03, ETA 0:03 | sweep 0:03"


def test_misjudged_sweep_size_is_dropped():
    sweep = Sweep(2, clock=Clock())
    sweep.start_job(2)
    assert sweep.total is None and sweep.position() == "run 3"


def test_job_label_keeps_the_swept_keys():
    assert job_label(["method=fedper", "rounds=5", "alpha=0.1"], ["method", "alpha"]) == "method=fedper alpha=0.1"
    assert job_label(["rounds=5"], []) == ""


@pytest.mark.parametrize("progress", [True, False])
def test_runner_logs_a_progress_line_per_round(compose, tiny_overrides, monkeypatch, progress):
    from pflower.server_app import runner
    from pflower.simulation.inprocess import InProcessGrid

    lines: list[str] = []
    real_log = runner.log
    monkeypatch.setattr(
        runner, "log", lambda level, msg, *args: (lines.append(msg % args), real_log(level, msg, *args))
    )
    runner.run_experiment(
        InProcessGrid(4), compose(*tiny_overrides, "method=fedavg", f"progress={str(progress).lower()}")
    )
    shown = [x for x in lines if x.startswith("progress: ")]
    if progress:
        assert [x.split(" [")[0] for x in shown] == ["progress: round 1/2", "progress: round 2/2"]
        assert shown[-1].endswith("| ETA 0:00")
    else:
        assert shown == []
