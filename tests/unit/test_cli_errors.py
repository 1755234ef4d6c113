"""Bad input to `pflower sim` ends in one line naming the key, the bad value and the fix, exit
status 2, before Ray starts and before any run directory exists; through the ServerApp as
`flwr run` runs it, one ERROR line ``pflower: ...`` and no traceback, the run fails (the
exception reaches Flower, which marks the run failed) and no run directory is left (issue 16)."""

import logging

import pytest
from flwr.app import Context, RecordDict
from flwr.common import log
from flwr.supercore.logger import FLOWER_LOGGER

from pflower.cli import main
from pflower.server_app.app import main as server_app_main
from pflower.server_app.failures import USER_ERRORS
from pflower.simulation.inprocess import InProcessGrid

CASES = [
    (["lr=abc"], ["lr='abc' is not a number", "lr=0.05"]),
    (["rounds=2.5"], ["rounds=2.5 is not a whole number"]),
    (["rouns=5"], ["unknown key 'rouns'", "did you mean rounds?"]),
    (["method.kpp=3"], ["unknown key 'method.kpp'", "did you mean method.kp?"]),
    (
        ["method=fedavg", "method.warmup=0.5"],
        ["method 'fedavg' has no option 'warmup'", "its options: finetune_epochs"],
    ),
    (
        ["method=fedavg", "method.kp=5"],
        ["method 'fedavg' has no option 'kp'", "its options: finetune_epochs", "pflower methods fedavg"],
    ),
    (["method=fedbn", "method.kp=5"], ["method 'fedbn' has no option 'kp'", "it has no options"]),
    (
        ["method.feature_upload=samples"],
        ["method 'fedcmd' has no option 'feature_upload'", "its options: candidates, score_mode"],
    ),
    (["method=fedcpmd", "method.ablaton=x"], ["unknown key 'method.ablaton'", "did you mean method.ablation?"]),
    (
        ["method=felo", "method.feature_upload=all"],
        ["feature_upload must be one of ['class_mean', 'samples']", "'all'"],
    ),
    (["method=nosuch"], ["unknown method 'nosuch'", "fedavg", "kapc"]),
    (
        ["experiment=fedcmd_fmnist", "model=resnet18"],
        ["model 'resnet18' has no option 'fc_layers'", "~model.fc_layers"],
    ),
    (["model=nosuch"], ["unknown model 'nosuch'", "lenet5"]),
    (["-m", "method=fedavg,nosuch"], ["unknown method 'nosuch'"]),  # every value of a sweep is checked
    (["method=fedcmd", "rounds=3"], ["FedCMD kp=20 leaves no phase-2 round", "set method.kp below rounds"]),
    (["method=fedcpmd", "method.kp=5", "method.distance=kl"], ["distance", "js"]),
    (["fraction=0"], ["fraction must be in (0, 1]"]),
    (["alpha=-1"], ["alpha must be > 0"]),
    (["backend=dask"], ["backend must be one of ['batched', 'parallel', 'ray', 'serial']", "'dask'"]),
    (["deterministic=maybe"], ["deterministic must be true or false", "'maybe'"]),
    (["optimizer_state=always"], ["optimizer_state must be one of ['fresh', 'kept']", "'always'"]),
    (["batch_clients=0"], ["batch_clients must be a positive whole number (backend=batched)", "got 0"]),
]


@pytest.mark.parametrize("args, expected", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_setting_is_one_line_with_the_fix_and_exit_2(args, expected, tmp_path, capsys):
    out = tmp_path / "outputs"
    assert main(["sim", *args, f"output_dir={out}", "num_clients=4", "dataset=digits"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("pflower: "), err
    for text in expected:
        assert text in err, err
    assert not out.exists()  # nothing half-made


def test_a_suggestion_comes_from_the_chosen_method_only(tmp_path, capsys):
    """FedCMD (the default method) has no option close to 'not_an_option'; FedCPMD's 'ablation' is
    close, but suggesting it would only fail next (issue 43)."""
    out = tmp_path / "outputs"
    assert main(["sim", "method.not_an_option=1", f"output_dir={out}", "dataset=digits"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown key 'method.not_an_option'" in err and "ablation" not in err, err
    from pflower.server_app.config import chosen_files, config_keys

    assert chosen_files(["experiment=fedcpmd_fmnist"])["method"] == "fedcpmd"  # an experiment's method counts
    assert "method.ablation" in config_keys({"method": "fedcpmd"}) and "method.ablation" not in config_keys(
        {"method": "fedcmd"}
    )


def test_a_dataset_root_without_the_files_is_refused_before_anything_is_written(tmp_path, capsys):
    """An explicit dataset.root that lacks the files never falls back to another copy (a run would read
    the default directory while its config.yaml records the root it was given)."""
    out = tmp_path / "outputs"
    missing = tmp_path / "nonexistent"
    assert main(["sim", "dataset=fmnist", f"dataset.root={missing}", f"output_dir={out}", "num_clients=4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"dataset.root='{missing}' does not hold its files" in err, err
    assert "leave it unset" in err and not out.exists()


# run-config as `flwr run . --run-config "..."` passes it (typed by pyproject's defaults)
SMALL_RUN = {"num_clients": 4, "dataset": "digits", "overrides": "partition.min_size=20"}
SERVERAPP_CASES = [
    ({"lr": "abc"}, 4, ["lr='abc' is not a number", "lr=0.05"]),
    ({"overrides": "rouns=5"}, 4, ["unknown key 'rouns'", "did you mean rounds?"]),
    ({"method": "nosuch"}, 4, ["unknown method 'nosuch'", "fedavg"]),
    ({"nosuch_key": 1}, 4, ["unknown run-config key 'nosuch_key'", "valid keys"]),
    ({"method": "fedcmd", "rounds": 3}, 4, ["FedCMD kp=20 leaves no phase-2 round", "set method.kp below rounds"]),
    ({"fraction": 0.0}, 4, ["fraction must be in (0, 1]"]),
    (
        {"method": "fedavg", "rounds": 1},
        3,
        ["3 SuperNodes but num_clients=4", "num-supernodes=4"],
    ),  # after the run dir exists
    ({"resume": "/nonexistent/run"}, 4, ["cannot resume", "does not exist"]),
]


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("run_config, nodes, expected", SERVERAPP_CASES, ids=[str(c) for c, _, _ in SERVERAPP_CASES])
def test_a_bad_setting_under_flwr_run_is_one_log_line_and_a_failed_run(run_config, nodes, expected, tmp_path):
    out = tmp_path / "outputs"
    context = Context(
        run_id=1,
        node_id=0,
        node_config={},
        state=RecordDict(),
        run_config={**SMALL_RUN, "output_dir": str(out), **run_config},
    )
    lines = Lines()
    FLOWER_LOGGER.addHandler(lines)
    try:
        with pytest.raises(USER_ERRORS) as failed:  # Flower catches it: the run ends as finished:failed
            server_app_main(InProcessGrid(nodes), context)
        # what Flower's ServerApp runner then logs (run_serverapp.py): dropped, the line above says it all
        log(logging.ERROR, "ServerApp raised an exception", exc_info=failed.value)
    finally:
        FLOWER_LOGGER.removeHandler(lines)
    errors = [r for r in lines.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None, [r.getMessage() for r in errors]
    message = errors[0].getMessage()
    assert message.startswith("pflower: ") and "\n" not in message, message
    for text in expected:
        assert text in message, message
    assert not [p for p in out.glob("*/*")], list(out.rglob("*"))  # no half-made run directory


@pytest.mark.parametrize(
    "methods, bad",
    [("fedavg,fedcmd", ["fedcmd"]), ("kapc,fedcpmd,fedcmd", ["fedcpmd", "fedcmd"])],
)
def test_a_sweep_is_refused_before_its_first_run_with_every_bad_combination(methods, bad, tmp_path, capsys):
    """Every combination builds its strategy first: FedAvg does not run for minutes before the sweep
    stops at FedCMD's kp (issue 28)."""
    out = tmp_path / "outputs"
    assert (
        main(["sim", "-m", f"method={methods}", "rounds=5", f"output_dir={out}", "num_clients=4", "dataset=digits"])
        == 2
    )
    err = capsys.readouterr().err
    for method in bad:
        assert f"method={method}" in err and {"fedcmd": "FedCMD kp=20", "fedcpmd": "FedCPMD kp=60"}[method] in err, err
    assert "method=kapc" not in err and "method=fedavg" not in err
    assert ("2 of the sweep's runs cannot start" in err) == (len(bad) == 2)
    assert not out.exists()


def test_the_sweep_checks_every_combination_of_two_swept_keys(tmp_path, capsys):
    out = tmp_path / "outputs"
    args = ["sim", "-m", "method=fedavg,fedcmd", "rounds=5,40", f"output_dir={out}", "num_clients=4", "dataset=digits"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "method=fedcmd rounds=5" in err and "rounds=40" not in err, err  # fedcmd at 40 rounds is fine
    assert not out.exists()


def test_flowers_exit_message_after_a_user_error_says_what_happened(tmp_path):
    """Flower ends a failed run with 'Exit Code: 700 ... An unhandled exception occurred': after a
    pflower line that named the setting, that text is replaced (the exit code stays)."""
    from pflower.server_app.failures import USER_ERROR_EXIT

    context = Context(
        run_id=1,
        node_id=0,
        node_config={},
        state=RecordDict(),
        run_config={**SMALL_RUN, "output_dir": str(tmp_path), "lr": "abc"},
    )
    lines = Lines()
    FLOWER_LOGGER.addHandler(lines)
    try:
        with pytest.raises(USER_ERRORS):
            server_app_main(InProcessGrid(4), context)
        log(
            logging.ERROR,
            "Exit Code: 700\n\nAn unhandled exception occurred when running the simulation.\n\nFor more information, "
            "visit: <x>",
        )
    finally:
        FLOWER_LOGGER.removeHandler(lines)
    messages = [r.getMessage() for r in lines.records if r.levelno >= logging.ERROR]
    assert messages[-1] == f"Exit Code: 700\n{USER_ERROR_EXIT}" and "unhandled" not in "".join(messages)


def test_an_option_typo_in_a_users_own_serverapp_is_one_line_in_flowers_log():
    """Issue 60: `FedCMD(..., kpp=1)` in the user's own ServerApp; Flower logs the ServerApp's
    exception with its traceback, which pflower's filter turns into one line with the fix."""
    import torch.nn as nn

    from pflower.strategies import FedCMD, OptionError, client_spec

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep()
    FLOWER_LOGGER.addHandler(handler)
    try:
        with pytest.raises(OptionError) as err:
            FedCMD(nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2)), client_spec(), num_clients=2, kpp=1)
        log(logging.ERROR, "%s raised an exception", "ServerApp", exc_info=err.value)
    finally:
        FLOWER_LOGGER.removeHandler(handler)
    (record,) = [r for r in records if "kpp" in r.getMessage()]
    assert record.getMessage().startswith("pflower: method 'fedcmd' has no option(s) ['kpp'] (did you mean kp?)")
    assert record.exc_info is None


def test_a_key_deletion_reaches_the_run_as_the_model_error_advises(tmp_path, capsys):
    """`~model.fc_layers` (what the error for an experiment's LeNet-5 option on a ResNet says to
    write) reaches the run as written, in a single run and in every run of a sweep."""
    from pflower.server_app.run_plan import plan_run
    from pflower.simulation.sim_command import runs_of

    argv = ["experiment=fedcmd_fmnist", "model=resnet18", "~model.fc_layers", "seed=1,2"]
    assert runs_of(argv) == [argv]  # no -m: one run (its `seed=1,2` is hydra's to refuse)
    assert runs_of(["-m", *argv])[1] == ["experiment=fedcmd_fmnist", "model=resnet18", "~model.fc_layers", "seed=2"]
    plan = plan_run(["experiment=fedcmd_fmnist", "model=resnet18", "~model.fc_layers", "dataset=digits"])
    (spec,) = plan.archs.values()
    assert spec["name"] == "resnet18" and "fc_layers" not in spec


@pytest.mark.heavy  # two runs of a sweep
def test_a_sweep_over_methods_takes_an_option_both_have(tmp_path):
    """`-m method=kapc,kapc_bls method.lam=0.5`: each run planned on its own, so the default
    method (which has no lam) is never composed with the option."""
    import yaml

    from pflower.cli import main

    argv = ["sim", "-m", "method=kapc,kapc_bls", "method.lam=0.5", "rounds=1", "dataset=digits", "num_clients=4"]
    assert main([*argv, "backend=serial", "progress=false", f"output_dir={tmp_path}"]) == 0
    configs = [yaml.safe_load(p.read_text())["method"] for p in sorted(tmp_path.glob("*/*/config.yaml"))]
    assert sorted((c["name"], c["lam"]) for c in configs) == [("kapc", 0.5), ("kapc_bls", 0.5)]
