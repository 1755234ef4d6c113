"""Config composition and config errors: one clear message before any round starts."""

import tomllib
from pathlib import Path

import pytest

from pflower.server_app.config import ConfigError, _defaults, compose_config, conf_dir, overrides_from_run_config
from pflower.server_app.run_plan import plan_run
from pflower.server_app.runner import check_data

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_run_config_matches_conf_defaults():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    defaults = _defaults()
    for key, value in declared.items():
        if key != "overrides":
            assert defaults[key] == value, (
                f"pyproject [tool.flwr.app.config] {key}={value!r} but conf/ says {defaults[key]!r}"
            )


def test_run_config_becomes_overrides_only_where_it_differs():
    assert overrides_from_run_config({"method": "fedcmd", "rounds": 30}) == []
    assert overrides_from_run_config({"method": "fedavg", "alpha": 0.1, "overrides": "method.finetune_epochs=2"}) == [
        "method=fedavg",
        "alpha=0.1",
        "method.finetune_epochs=2",
    ]
    cfg = compose_config(
        overrides_from_run_config({"method": "fedavg", "alpha": 0.1, "overrides": "method.finetune_epochs=2"})
    )
    assert cfg.method.name == "fedavg" and cfg.partition.alpha == 0.1 and cfg.method.finetune_epochs == 2


def test_experiment_values_survive_default_run_config():
    cfg = compose_config(overrides_from_run_config({"experiment": "smoke", "rounds": 30}))
    assert cfg.rounds == 3  # smoke's value: the default rounds=30 from flwr is not applied


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["method=nope"], "fedavg"),  # hydra lists the available options
        (["dataset=nope"], "digits"),
        (["model=nope"], "lenet5"),
        (["partition=nope"], "dirichlet"),
        (["alpha=0"], "alpha must be > 0"),
        (["dataset=hf"], "dataset.options.path"),
        (["alpha=-0.5"], "alpha must be > 0"),
        (["fraction=1.5"], "fraction"),
        (["batch_size=1"], "batch_size"),
        (["+method.mu=1"], "no option"),
    ],
)
def test_config_errors_name_the_fix(overrides, match):
    with pytest.raises(ConfigError, match=match):
        compose_config(overrides)


def test_unknown_run_config_key():
    with pytest.raises(ConfigError, match="valid keys"):
        overrides_from_run_config({"rounds_": 3})


def test_more_clients_than_samples_fails_before_round_one():
    with pytest.raises(ConfigError, match="samples"):
        check_data(plan_run(["num_clients=5000"]))


def test_missing_dataset_files_say_where_and_how(tmp_path, monkeypatch):
    monkeypatch.delenv("PFLOWER_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError, match=r"cifar10.*looked for.*" + str(tmp_path / "nowhere")):
        check_data(plan_run(["dataset=cifar10", f"dataset.root={tmp_path / 'nowhere'}"]))


def _user_inputs(name: str, tmp_path) -> list[str]:
    """What an experiment leaves to its user: the partition file of one on ``partition=file``."""
    if "override /partition: file" not in (conf_dir() / "experiment" / f"{name}.yaml").read_text():
        return []
    path = tmp_path / "partition.json"
    path.write_text('{"clients": [[0, 1], [2, 3]]}')
    return [f"partition.path={path}"]


@pytest.mark.parametrize("name", sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml")))
def test_every_experiment_file_composes_and_validates(name: str, tmp_path):
    """An experiment names a dataset, model and method that exist, with valid values."""
    from pflower.server_app.config import validate

    cfg = compose_config([f"experiment={name}", f"output_dir={tmp_path}", *_user_inputs(name, tmp_path)])
    validate(cfg)
    assert cfg.rounds >= 1


@pytest.mark.parametrize("name", sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml")))
def test_every_experiment_runs_a_baseline_on_its_set_up(name: str, tmp_path):
    """``experiment=X method=fedavg``: the set-up with another method. The experiment's options
    for its own method (FedCPMD's kp, FedTSDP's h_th) are left out, not an error."""
    cfg = compose_config(
        [f"experiment={name}", "method=fedavg", f"output_dir={tmp_path}", *_user_inputs(name, tmp_path)]
    )
    assert set(cfg.method) - {"name"} <= {"finetune_epochs"}


def test_an_option_the_command_line_names_for_the_wrong_method_still_fails():
    with pytest.raises(ConfigError, match=r"'ditto' has no option\(s\) \['h_th'\]"):
        compose_config(["experiment=fedtsdp_fmnist_cnn", "method=ditto", "method.h_th=0.7"])


def test_an_experiment_keeps_its_values_for_its_own_method():
    assert compose_config(["experiment=fedtsdp_fmnist_cnn", "method=fedtsdp"]).method.eps2 == 0.1
    assert compose_config(["experiment=fedtsdp_fmnist_cnn"]).method.h_th == 0.76
