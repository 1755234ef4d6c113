"""`--jobs` parsing and its refusals (the concurrent sweep itself: tests/integration/test_sweep_jobs.py)."""

import pytest

from server_app.cli import main
from server_app.sweep_jobs import parse_jobs


def test_jobs_is_taken_out_of_the_command_line():
    assert parse_jobs(["-m", "seed=1,2"]) == (1, ["-m", "seed=1,2"])
    assert parse_jobs(["-m", "--jobs", "3", "seed=1,2"]) == (3, ["-m", "seed=1,2"])
    assert parse_jobs(["-j", "2", "-m"]) == (2, ["-m"])
    assert parse_jobs(["--jobs=4"]) == (4, [])
    for bad in (["--jobs", "0"], ["--jobs", "two"], ["--jobs=-1"], ["-j"]):
        with pytest.raises(ValueError):
            parse_jobs(bad)


@pytest.mark.parametrize("args, message", [
    (["--jobs", "2", "seed=1"], "pflower: --jobs runs a sweep's runs at once: add -m"),
    (["-m", "--jobs", "x", "seed=1,2"], "pflower: --jobs must be a whole number >= 1, got 'x'"),
    (["-m", "--jobs", "2", "seed=range(1,3)"], "pflower: --jobs needs the sweep's values listed"),
])
def test_jobs_refusals_are_one_line(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sim", *args, f"output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
