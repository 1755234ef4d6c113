"""The batched engine (``backend=batched``) trains a round's clients as one computation; its
float sums run in another order than the one-at-a-time engines', so its numbers equal theirs to
a tolerance, not bit for bit. Stated and tested here, for the pinned cases of every batched method and three
fallbacks:

- every train reply's tensors within ``RTOL`` of the serial engine's (relative to the tensor's
  largest magnitude), and its losses (each training stage's, both evaluations', evaluated as one
  computation too) within ``RTOL`` (relative);
- the methods whose roles train by a FitPlan run batched (no client alone); a role that is not
  a plan (three stand for the rest) trains one client at a time on the same engine, says so in
  one log line, and equals the serial engine's numbers within the same tolerance.

On the synthetic images (noise everywhere), not the pinned cases' digits: those are 8x8 images
upsampled bilinearly, whose flat background gives exactly equal values in max-pooling windows
(249 positive ties in one batch of 32 after conv1). A max with ties has no unique gradient; which
input gets it follows the convolution's last bit, so one engine's gradient can differ from the
other's by its whole size there. docs/engines.md says so.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from pflower.server_app.run_plan import plan_run
from pflower.server_app.runner import run_experiment
from pflower.simulation.batched import BatchedGrid
from pflower.simulation.inprocess import InProcessGrid
from pinned.cases import CASES, overrides

RTOL = 1e-4
# the methods whose client training is a FitPlan (plain SGD, a proximal penalty, a trained subset,
# statistics after training); FedCMD with its votes taken after training (the default takes them
# on the training batches: those rounds train one client at a time)
BATCHED = {
    "local": [],
    "fedavg": [],
    "fedavg_mixed": [],  # three architectures: one group each
    "fedprox": [],
    "fedper": [],
    "fedbabu": [],
    "fedbn": [],
    "lgfedavg": [],
    "fedamp": [],
    "pfedla": [],
    "pfedsim": [],
    "cfl": [],
    "fedtsdp": [],
    "fedcmd": ["method.selection_timing=after_training"],
    "feddyn": [],  # two penalties, the state g updated after training
    "ditto": [],  # two stages: the personal model, then the global one
    "fedrep": [],  # two stages: the head, then the body
    "kapc": [],  # the proximal pull toward the server's regularizer
    "kapc_bls": [],  # and the upload choice after training
    "fedcpmd": ["method.selection_timing=after_training"],
}
# votes taken on the training batches (the default): those rounds one client at a time with the
# log line, the other rounds batched
MIXED = {"fedcmd": [], "fedcpmd": []}
# past FedCMD's 2 vote rounds into phase 2; FedAMP's cloud models; FedCPMD needs a phase-2 round
# Ditto's personal model and FedDyn's g: a second round starts from the state the first kept
ROUNDS = {"fedcmd": 3, "fedamp": 2, "fedcpmd": 2, "ditto": 2, "feddyn": 2}


def one_run(case: str, grid_cls, extra: list[str], tmp_path, name: str):  # noqa: ANN001, ANN201
    """One short run of ``case`` on the synthetic images (``batch_clients=2``: a round in chunks)."""
    base = ["dataset=synthetic" if o == "dataset=digits" else o for o in overrides(case)]
    rounds = f"rounds={ROUNDS.get(case, 1)}"
    plan = plan_run([*base, "dataset.options.num_samples=1200", *extra, rounds, f"output_dir={tmp_path / name}"])
    n = plan.run.num_clients
    if grid_cls is BatchedGrid:  # evaluation batched too (on a CPU the default evaluates one at a time)
        grid = BatchedGrid(n, batch_clients=2, threads=1, record=True, batch_eval=True)
    else:
        grid = InProcessGrid(n)
    run_experiment(grid, plan)
    return grid


def train_replies(grid) -> list:  # noqa: ANN001
    return [r for r in grid.replies if r.metadata.message_type == "train" and not r.has_error()]


# three roles that are not plans stand for the rest (each is also a pinned case of the other engines)
ALONE = ["moon", "fedfomo", "fedap"]


KINDS = [*((c, "batched") for c in BATCHED), *((c, "mixed") for c in MIXED), *((c, "alone") for c in ALONE)]


@pytest.mark.parametrize("case, kind", KINDS)
@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_the_batched_engine_equals_the_serial_one_within_the_tolerance(case, kind, tmp_path, caplog):
    torch.set_num_threads(1)
    extra = {"batched": BATCHED, "mixed": MIXED}.get(kind, {}).get(case, [])
    serial = one_run(case, InProcessGrid, extra, tmp_path, "serial")
    with caplog.at_level(logging.INFO):
        batched = one_run(case, BatchedGrid, extra, tmp_path, "batched")
    expected, actual = train_replies(serial), train_replies(batched)
    assert len(expected) == len(actual) > 0
    for a, b in zip(expected, actual):
        arrays_a, arrays_b = a.content.array_records["arrays"], b.content.array_records["arrays"]
        assert list(arrays_a) == list(arrays_b)
        for key in arrays_a:
            x, y = arrays_a[key].numpy(), arrays_b[key].numpy()
            scale = max(float(np.abs(x).max()), 1e-6)
            assert np.abs(x - y).max() <= RTOL * scale, f"{case}: {key} differs by {np.abs(x - y).max():.3g}"
        metrics_a, metrics_b = (m.content.metric_records["metrics"] for m in (a, b))
        losses = [k for k in metrics_a if k.endswith("_loss") and not k.startswith("test_")]  # each stage's
        assert "train_loss" in losses and set(losses) <= set(metrics_b)
        for key in losses:
            assert metrics_b[key] == pytest.approx(metrics_a[key], rel=RTOL, nan_ok=True), f"{case}: {key}"
        # the evaluated models: the one kept from the round before (Ditto's v) and the trained one
        for key in ("test_before_loss_sum", "test_after_loss_sum"):
            assert metrics_b[key] == pytest.approx(metrics_a[key], rel=RTOL), f"{case}: {key}"
    said = [r.getMessage() for r in caplog.records if "trains one client at a time" in r.getMessage()]
    if kind == "batched":
        assert batched.alone_clients == 0 and batched.batched_clients == len(actual), said
    elif kind == "mixed":
        assert batched.alone_clients > 0 and batched.batched_clients > 0 and said, (batched.alone_clients, said)
    else:
        assert batched.batched_clients == 0 and said, f"{case}: no log line says why its clients train alone"


def group_sizes(monkeypatch, module, name: str) -> list[int]:  # noqa: ANN001
    """``module.name`` (a function of a list of models first) wrapped: the list's length at each call."""
    sizes: list[int] = []
    real = getattr(module, name)

    def recording(models, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        sizes.append(len(models))
        return real(models, *args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return sizes


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_a_round_runs_in_chunks_of_batch_clients(tmp_path, monkeypatch):
    """Memory: at most ``batch_clients`` clients are prepared and trained at once, whatever the
    round's size (a round of 1,000 clients holds that many models, not 1,000)."""
    import pflower.client_app.grouped_training as engine

    sizes = group_sizes(monkeypatch, engine, "train_together")
    plan = plan_run(
        [
            "dataset=synthetic",
            "num_clients=5",
            "fraction=1.0",
            "rounds=2",
            "local_epochs=1",
            "partition.min_size=20",
            "method=fedavg",
            "progress=false",
            f"output_dir={tmp_path}",
        ]
    )
    grid = BatchedGrid(5, batch_clients=2, threads=1)
    run_experiment(grid, plan)
    assert sizes == [2, 2, 1, 2, 2, 1]
    assert grid.batched_clients == 10 and grid.alone_clients == 0


@pytest.mark.parametrize("batch_eval, together", [(None, 0), (True, 4)])
@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_evaluation_is_batched_when_asked_and_on_cuda_by_default(batch_eval, together, tmp_path, monkeypatch):
    """Two rounds of 2 clients: test_before and test_after, each one call for the chunk's two
    models when batched; none on this CPU by default (one at a time is faster on a CPU)."""
    import pflower.simulation.batched as engine

    calls = group_sizes(monkeypatch, engine, "evaluate_together")
    plan = plan_run(
        ["dataset=synthetic", "num_clients=2", "fraction=1.0", "rounds=2", "local_epochs=1", "partition.min_size=20"]
        + ["method=fedavg", "progress=false", "final_eval=false", f"output_dir={tmp_path}"]
    )
    run_experiment(BatchedGrid(2, threads=1, batch_eval=batch_eval), plan)
    assert sum(calls) == 2 * together and all(n == 2 for n in calls)


def test_the_lists_name_pinned_cases():
    assert set(BATCHED) | set(MIXED) | set(ALONE) <= set(CASES)


def test_batch_clients_must_be_a_positive_whole_number():
    with pytest.raises(ValueError, match="batch_clients must be a positive whole number"):
        BatchedGrid(3, batch_clients=0)


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_a_client_with_dropout_trains_alone_with_the_serial_engines_masks(tmp_path, caplog):
    """A model with dropout cannot run under vmap, so its clients train one at a time after the
    whole chunk was prepared; each starts from the random state its own preparation left (the
    serial engine's masks), not the last prepared client's: the replies equal the serial ones."""
    torch.set_num_threads(1)
    overrides_ = ["dataset=synthetic", "dataset.options.num_samples=600", "num_clients=3", "fraction=1.0"]
    overrides_ += ["rounds=1", "local_epochs=1", "partition.min_size=20", "method=fedavg", "model=cnn_fedtsdp"]
    overrides_ += ["progress=false", "final_eval=false"]
    grids = {}
    serial, batched = InProcessGrid(3, record=True, client_threads=1), BatchedGrid(3, threads=1, record=True)
    for name, grid in (("serial", serial), ("batched", batched)):
        plan = plan_run([*overrides_, f"output_dir={tmp_path / name}"])
        with caplog.at_level(logging.INFO):
            run_experiment(grid, plan)
        grids[name] = grid
    assert grids["batched"].alone_clients == 3 and any("vmap" in r.getMessage() for r in caplog.records)
    for a, b in zip(train_replies(grids["serial"]), train_replies(grids["batched"])):
        arrays_a, arrays_b = a.content.array_records["arrays"], b.content.array_records["arrays"]
        for key in arrays_a:
            assert np.array_equal(arrays_a[key].numpy(), arrays_b[key].numpy()), key


@pytest.mark.parametrize("case", ["fedper", "ditto"])
@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_runs_together_equal_each_run_alone_within_the_tolerance(case, tmp_path):
    """``pflower sim --together``: two seeds of a method share each round's training (one group
    twice as wide); each run's train replies equal its replies alone on the batched engine."""
    from pflower.simulation.together import run_together

    torch.set_num_threads(1)
    base = ["dataset=synthetic" if o == "dataset=digits" else o for o in overrides(case)]
    base += ["dataset.options.num_samples=1200", "rounds=2", "backend=batched", "workers=1"]
    seeds = ["seed=1", "seed=2"]
    alone = []
    for seed in seeds:
        plan = plan_run([*base, seed, f"output_dir={tmp_path / 'alone'}"])
        grid = BatchedGrid(plan.run.num_clients, threads=1, record=True)
        run_experiment(grid, plan)
        alone.append(train_replies(grid))
    recorded: dict[int, BatchedGrid] = {}  # run -> its grid (each made in its run's thread)
    real = BatchedGrid.__init__

    def recording(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        import threading

        real(self, *args, **{**kwargs, "record": True})
        recorded[int(threading.current_thread().name.rsplit("-", 1)[1])] = self

    plans = [plan_run([*base, seed, f"output_dir={tmp_path / 'together'}"]) for seed in seeds]
    try:
        BatchedGrid.__init__ = recording
        outcomes = run_together(plans, seeds)
    finally:
        BatchedGrid.__init__ = real
    assert not any(isinstance(o, Exception) for o in outcomes), outcomes
    per_round = len(alone[0]) // 2  # a run's clients a round (2 rounds)
    assert recorded[0].trainer.widths == [2 * per_round] * 2  # both runs' clients in each round's training
    for k, expected in enumerate(alone):
        grid = recorded[k]
        actual = train_replies(grid)
        assert len(actual) == len(expected) > 0
        for a, b in zip(expected, actual):
            arrays_a, arrays_b = a.content.array_records["arrays"], b.content.array_records["arrays"]
            for key in arrays_a:
                x, y = arrays_a[key].numpy(), arrays_b[key].numpy()
                assert np.abs(x - y).max() <= RTOL * max(float(np.abs(x).max()), 1e-6), f"{case}: {key}"


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_a_method_without_plans_runs_on_the_parallel_engine_with_its_numbers(tmp_path, caplog):
    """``backend=batched`` for a method whose role overrides ``fit`` (MOON): every client would
    train alone, so the run goes to the parallel engine, says so, and writes the pinned numbers."""
    import json

    from pflower.server_app.results import read_metrics
    from pflower.simulation.simulate import simulate
    from pinned.cases import fingerprint, first_difference, load_pinned

    torch.set_num_threads(1)
    plan = plan_run([*overrides("moon"), "backend=batched", "workers=2", f"output_dir={tmp_path}"])
    with caplog.at_level(logging.INFO):
        summary = simulate(plan)
    assert any("client role moon has no FitPlan" in r.getMessage() for r in caplog.records)
    got = json.loads(json.dumps(fingerprint(read_metrics(summary["run_dir"]), summary), sort_keys=True))
    assert first_difference(load_pinned()["moon"], got) is None
