"""``pflower sim``'s command line into runs: one list of overrides per run, a ``-m`` sweep expanded
as hydra's basic sweeper expands a multirun, with no second hydra app (simulation/sim_command.py)."""

from __future__ import annotations

import pytest

from pflower.server_app.config import ConfigError
from pflower.server_app.run_plan import plan_run
from pflower.simulation.sim_command import runs_of, swept_keys


def test_a_sweep_is_the_product_of_its_values_in_hydras_order():
    runs = runs_of(["-m", "method=fedavg,fedper", "seed=range(1,3)", "rounds=2"])
    assert runs == [
        ["method=fedavg", "seed=1", "rounds=2"],
        ["method=fedavg", "seed=2", "rounds=2"],
        ["method=fedper", "seed=1", "rounds=2"],
        ["method=fedper", "seed=2", "rounds=2"],
    ]
    assert swept_keys(runs) == ["method", "seed"]


def test_glob_choice_and_a_repeated_key():
    """glob() lists a config group's files; choice() its values; a key given twice: the last one."""
    runs = runs_of(["-m", "method=glob(fedc*)", "+method.x=1", "~model.fc_layers"])
    assert runs == [
        ["method=fedcmd", "+method.x=1", "~model.fc_layers"],
        ["method=fedcpmd", "+method.x=1", "~model.fc_layers"],
    ]
    assert runs_of(["-m", "seed=choice(1,2)", "seed=3,4"]) == [["seed=3"], ["seed=4"]]


def test_a_single_run_is_its_overrides_as_written():
    assert runs_of(["method=fedper", "~model.fc_layers"]) == [["method=fedper", "~model.fc_layers"]]
    with pytest.raises(ConfigError, match=r"seed=1,2: a comma-separated value sweeps; add -m"):
        plan_run(["seed=1,2"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-m", "lr=interval(0,1)"], "an interval sweep has no list of runs"),
        (["hydra.run.dir=."], "starts no hydra app, so hydra's own settings have no effect"),
        (["hydra/job_logging=none"], "starts no hydra app"),
        (["--cfg", "job"], "pflower sim has no flag --cfg"),
        (["fedper"], "'fedper' is not an override: write key=value"),
    ],
)
def test_what_pflower_sim_does_not_take_is_one_line(argv, message):
    with pytest.raises(ConfigError, match=message):
        runs_of(argv)


def test_the_command_says_it_in_one_line(tmp_path, capsys):
    from pflower.cli import main

    assert main(["sim", "hydra.run.dir=.", f"output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pflower: hydra.run.dir=.: pflower sim composes conf/ itself") and "Traceback" not in err
    assert not (tmp_path / "out").exists()
