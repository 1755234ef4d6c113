"""`--jobs` parsing and its refusals (the concurrent sweep itself: tests/integration/test_sweep_jobs.py)."""

import pytest

from pflower.cli import main
from pflower.simulation.sweep_jobs import parse_jobs


def test_jobs_is_taken_out_of_the_command_line():
    assert parse_jobs(["-m", "seed=1,2"]) == (1, ["-m", "seed=1,2"])
    assert parse_jobs(["-m", "--jobs", "3", "seed=1,2"]) == (3, ["-m", "seed=1,2"])
    assert parse_jobs(["-j", "2", "-m"]) == (2, ["-m"])
    assert parse_jobs(["--jobs=4"]) == (4, [])
    for bad in (["--jobs", "0"], ["--jobs", "two"], ["--jobs=-1"], ["-j"]):
        with pytest.raises(ValueError):
            parse_jobs(bad)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--jobs", "2", "seed=1"], "pflower: --jobs runs a sweep's runs at once: add -m"),
        (["-m", "--jobs", "x", "seed=1,2"], "pflower: --jobs must be a whole number >= 1, got 'x'"),
    ],
)
def test_jobs_refusals_are_one_line(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sim", *args, f"output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_sweeps_share_of_the_cores_reaches_workers_auto(monkeypatch):
    """`--jobs N` gives each run `cores // N` through PFLOWER_CORES; `workers=auto` takes it, and on
    CUDA still caps it at CUDA_AUTO_WORKERS; a count on the command line is kept."""
    import os

    from pflower.server_app.config import CORES_ENV, CUDA_AUTO_WORKERS, default_workers, resolve_workers

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.delenv(CORES_ENV, raising=False)
    assert default_workers() == 16
    monkeypatch.setenv(CORES_ENV, "8")  # --jobs 2 on 16 cores
    assert resolve_workers("auto") == 8 and resolve_workers("auto", on_cuda=True) == CUDA_AUTO_WORKERS == 4
    assert resolve_workers(6) == 6
    monkeypatch.setenv(CORES_ENV, "32")  # never more than the process may use
    assert default_workers() == 16
    for ignored in ("0", "x", ""):
        monkeypatch.setenv(CORES_ENV, ignored)
        assert default_workers() == 16


def test_each_run_of_a_jobs_sweep_gets_its_share_in_its_environment(monkeypatch, capsys):
    """The runs are started with PFLOWER_CORES = cores // jobs (a stand-in `pflower` prints it)."""
    import subprocess

    from pflower.server_app.config import CORES_ENV, default_workers
    from pflower.simulation import sweep_jobs

    monkeypatch.delenv(CORES_ENV, raising=False)
    started = []

    class FakePopen:
        def __init__(self, cmd, env=None, **kwargs):
            started.append((cmd, env))
            self.stdout = iter([f"cores {env[CORES_ENV]}\n"])

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    assert sweep_jobs.run_concurrently([["seed=1"], ["seed=2"]], jobs=2) == 0
    share = str(max(1, default_workers() // 2))
    assert sorted(cmd[2:] for cmd, _ in started) == [["seed=1"], ["seed=2"]]  # no workers= added
    assert all(env[CORES_ENV] == share for _, env in started)
    assert f"(PFLOWER_CORES={share})" in capsys.readouterr().out
