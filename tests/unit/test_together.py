"""``pflower sim --together``: the shared training step (simulation.together.SharedTrainer) and the
command line's refusals. The runs' numbers against each run alone: tests/pinned/test_batched_engine.py."""

from __future__ import annotations

import json
import threading

import pytest

from pflower.cli import main
from pflower.simulation import shared_trainer, together


@pytest.fixture
def joint_calls(monkeypatch):
    """train_tasks replaced: each task's outcome is its own value; the calls' task lists recorded."""
    calls: list[list] = []

    def fake(tasks, say):  # noqa: ANN001, ANN202
        calls.append(list(tasks))
        return [t * 10 for t in tasks]

    monkeypatch.setattr(shared_trainer, "train_tasks", fake)
    return calls


def in_threads(trainer: together.SharedTrainer, chunks: dict[str, list | None]) -> dict[str, list]:
    """Each run in its own thread, holding the lock as run_together's do: a list hands that chunk
    in, None ends the run without training."""
    out: dict[str, list] = {}

    def one(name: str, chunk: list | None) -> None:
        with trainer.lock:
            try:
                if chunk is not None:
                    out[name] = trainer.train(chunk, lambda role, reason: None)
            finally:
                trainer.leave()

    threads = [threading.Thread(target=one, args=item) for item in chunks.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads), "a run is still waiting"
    return out


def test_the_runs_chunks_train_once_all_are_in_and_each_gets_its_own_outcomes(joint_calls):
    trainer = together.SharedTrainer(3)
    out = in_threads(trainer, {"a": [1, 2], "b": [3], "c": [4, 5, 6]})
    assert len(joint_calls) == 1 and sorted(joint_calls[0]) == [1, 2, 3, 4, 5, 6]
    assert out == {"a": [10, 20], "b": [30], "c": [40, 50, 60]}
    assert trainer.widths == [6]


def test_a_run_that_ends_does_not_keep_the_others_waiting(joint_calls):
    trainer = together.SharedTrainer(3)
    out = in_threads(trainer, {"a": [1], "gone": None, "b": [2]})
    assert out == {"a": [10], "b": [20]} and [sorted(c) for c in joint_calls] == [[1, 2]]


def test_a_trainer_needs_a_run():
    with pytest.raises(ValueError, match="at least one run"):
        together.SharedTrainer(0)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--together", "seed=1", "backend=batched"],
            "pflower: --together runs a sweep's runs as one computation: add -m",
        ),
        (
            ["-m", "--together", "seed=1,2"],
            "pflower: --together trains a sweep's runs as one computation on the batched",
        ),
        (["-m", "--together", "--jobs", "2", "seed=1,2", "backend=batched"], "drop --jobs"),
    ],
)
def test_together_refusals_are_one_line(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sim", *args, "dataset=digits", f"output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_a_together_sweep_writes_each_runs_directory_and_labels_its_lines(tmp_path, monkeypatch, caplog):
    import json
    import logging

    monkeypatch.chdir(tmp_path)
    args = ["-m", "seed=1,2", "backend=batched", "workers=1", "dataset=digits", "method=fedavg", "rounds=2"]
    args += ["num_clients=3", "fraction=1.0", "local_epochs=1", "progress=false", "--together"]
    with caplog.at_level(logging.INFO):
        assert main(["sim", *args, f"output_dir={tmp_path / 'out'}"]) == 0
    summaries = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("*/*/summary.json"))]
    assert len(summaries) == 2 and all(s["rounds"] == 2 for s in summaries)
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("[seed=2] [round   2/2]") for line in lines), lines
    assert "together: 2 joint trainings, 6 to 6 clients each" in lines


def test_a_joint_training_that_raises_answers_every_run_with_the_error(monkeypatch):
    def broken(tasks, say):  # noqa: ANN001, ANN202
        raise RuntimeError("boom")

    monkeypatch.setattr(shared_trainer, "train_tasks", broken)
    out = in_threads(together.SharedTrainer(2), {"a": [1, 2], "b": [3]})
    assert sorted(out) == ["a", "b"] and all(isinstance(o, RuntimeError) for outs in out.values() for o in outs)
    assert len(out["a"]) == 2 and len(out["b"]) == 1


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_a_together_sweep_resumes_together_by_sweeping_resume(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["-m", "seed=1,2", "backend=batched", "workers=1", "dataset=digits", "method=fedavg", "rounds=2"]
    args += ["num_clients=3", "fraction=1.0", "local_epochs=1", "progress=false", f"output_dir={tmp_path / 'out'}"]
    assert main(["sim", *args, "--together"]) == 0
    runs = sorted((tmp_path / "out").glob("*/*"))
    assert main(["sim", "-m", "resume=" + ",".join(str(r) for r in runs), "rounds=3", "--together"]) == 0
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert (summary["rounds"], summary["resumed_after_rounds"]) == (3, [2])
