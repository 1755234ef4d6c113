"""`pflower sim` turns a bad value into one line naming it, exit status 2, no traceback."""

import pytest

from pflower.cli import main


@pytest.mark.parametrize(
    "args, message",
    [
        (["alpha=0"], "pflower: Dirichlet alpha must be > 0, got 0"),
        (["dataset=hf"], "pflower: dataset=hf needs dataset.options.path"),
        (["resume=/nonexistent/run"], "pflower: cannot resume: run directory /nonexistent/run does not exist"),
        (["workers=0"], "pflower: workers must be 'auto' or a positive whole number (backend=parallel), got 0"),
        (["ray.address=127.0.0.1:1"], "pflower: ray.address is set but backend=parallel: add backend=ray"),
        (["backend=ray", "ray.client_cpus=0"], "pflower: ray.client_cpus must be a number > 0, got 0"),
        (["backend=ray", "ray.client_gpus=-1"], "pflower: ray.client_gpus must be auto or a number >= 0"),
        (["backend=ray", "ray.address=nohost"], "pflower: ray.address='nohost' is not HOST:PORT"),
    ],
)
def test_sim_config_error_is_one_line_and_exit_2(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sim", *args, f"output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing was started or written


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_serial_backend_runs_every_client_in_this_process(tmp_path, monkeypatch):
    """`backend=serial`: no Ray; each client keeps its Context across rounds (FedPer's personal
    classifier persists: its test_before after round 1 is the personalized model's)."""
    import json

    import torch

    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    out = tmp_path / "out"
    args = [
        "sim",
        "backend=serial",
        "method=fedper",
        "num_clients=3",
        "rounds=2",
        "local_epochs=1",
        "fraction=1.0",
        "partition.min_size=20",
        "alpha=1.0",
        f"output_dir={out}",
    ]
    assert main(args) == 0
    (run,) = out.glob("*/*")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["clients"] for r in records] == [[0, 1, 2], [0, 1, 2]]
    assert records[1]["test_before_acc"] > records[0]["test_before_acc"]
    assert json.loads((run / "summary.json").read_text())["final_clients"] == 3
    assert torch.get_num_threads() == threads  # clients ran on one thread, the process's setting is back


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_an_experiment_runs_with_another_method(tmp_path, monkeypatch, capsys):
    """`pflower sim experiment=fedcpmd_fmnist method=fedavg`: hydra's own composition (not only the
    check before it) leaves FedCPMD's kp out; the run's saved config has FedAvg's options only."""
    import yaml

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    args = [
        "sim",
        "experiment=fedcpmd_fmnist",
        "method=fedavg",
        "dataset=digits",
        "backend=serial",
        "num_clients=3",
        "rounds=1",
        "local_epochs=1",
        "fraction=1.0",
        "partition.min_size=20",
        "alpha=1.0",
        f"output_dir={out}",
    ]
    assert main(args) == 0, capsys.readouterr().err
    (run,) = out.glob("*/*")
    assert yaml.safe_load((run / "config.yaml").read_text())["method"] == {"name": "fedavg", "finetune_epochs": 0}
