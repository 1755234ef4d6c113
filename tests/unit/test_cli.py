"""`pflower sim` turns a bad value into one line naming it, exit status 2, no traceback."""

import pytest

from server_app.cli import main


@pytest.mark.parametrize(
    "args, message",
    [
        (["alpha=0"], "pflower: Dirichlet alpha must be > 0, got 0"),
        (["dataset=hf"], "pflower: dataset=hf needs dataset.options.path"),
        (["resume=/nonexistent/run"], "pflower: cannot resume: run directory /nonexistent/run does not exist"),
    ],
)
def test_sim_config_error_is_one_line_and_exit_2(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sim", *args, f"output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing was started or written
