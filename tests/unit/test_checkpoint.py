"""Server checkpoint/resume through the in-process Grid: a resumed run equals an uninterrupted one.

A run of 4 rounds is compared with the same run crashed before round 3 and resumed with a
new strategy built from the checkpoint; the clients keep their contexts (their personal
state), as SuperNodes with a state dir do.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
import torch
from grid_faults import Crash, CrashingGrid
from test_strategy_base import make, run

from pflower.server_app.config import ConfigError
from pflower.server_app.results import read_metrics
from pflower.server_app.runner import build, run_experiment
from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies import STRATEGIES
from pflower.strategies.base import checkpoint as ckpt_mod
from pflower.strategies.base.checkpoint import (
    CheckpointError,
    decode,
    encode,
    load_checkpoint,
    save_checkpoint,
)
from pflower.strategies.fedper import FedPer

ROUND_KEYS = (
    "clients",
    "test_before_acc",
    "test_before_loss",
    "test_after_acc",
    "train_loss",
    "bytes_down",
    "bytes_up",
)


def run_dirs(out: Path) -> set[Path]:
    return {p for p in out.glob("*/*") if p.is_dir()}


def crashed_run(compose, overrides, crash_at=3, after_replies=False) -> tuple[Path, CrashingGrid]:
    cfg = compose(*overrides)
    out = Path(cfg.run.output_dir)
    before = run_dirs(out)
    grid = CrashingGrid(4, crash_at=crash_at, after_replies=after_replies)
    with pytest.raises(Crash):
        run_experiment(grid, cfg)
    (run_dir,) = run_dirs(out) - before
    grid.crash_at = None
    return run_dir, grid


def assert_same(a, b, path="state"):
    """Recursive equality; floats and arrays to 1e-6."""
    if dataclasses.is_dataclass(a):
        assert type(a) is type(b), path
        assert_same(vars(a), vars(b), path)
    elif isinstance(a, np.random.Generator):
        assert isinstance(b, np.random.Generator) and a.bit_generator.state == b.bit_generator.state, path
    elif isinstance(a, Mapping):  # dicts and the server's client stores
        assert isinstance(b, Mapping) and set(a) == set(b), (path, set(a) ^ set(b) if isinstance(b, Mapping) else b)
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, (np.ndarray, torch.Tensor)) or isinstance(a, float):
        np.testing.assert_allclose(
            np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), rtol=0, atol=1e-6, err_msg=path
        )
    else:
        assert a == b, (path, a, b)


CASES = {
    "fedavg": ["method=fedavg"],
    "fedper": ["method=fedper"],
    "fedcmd": ["method=fedcmd", "method.kp=3"],  # votes of rounds 1-2 restored, l* fixed after the resume
    # phase 2 relayed client to client: the next round starts from the last client's model
    "fedcmd_relay": ["method=fedcmd", "method.kp=1", "method.force_layer=fc2", "method.relay_phase2=true"],
    "pfedsim": ["method=pfedsim", "method.warmup=1"],  # bodies and S restored mid personal phase
    "mixed": ["method=fedavg", "model=mixed"],  # three architectures, each with its own global model
    "fedcpmd": ["method=fedcpmd", "method.kp=1"],  # votes, clusters and stored bodies restored in phase 2
    "kapc_bls": ["method=kapc_bls", "model=cnn_kapc"],  # the cube, stale layers, participation counts, BLS statistics
    # re-clusterings every round: clusters, public sampling weights, its own generator, the shared-unit counter
    "fedtsdp": [
        "method=fedtsdp",
        "dataset.public=holdout",
        "fraction=1.0",
        "method.h_th=0.0",
        "method.eps1=0.005",
        "method.eps2=inf",
    ],
    # the class-knowledge store, the CVAE's weights and its generator (a training every round)
    "velo": [
        "method=velo",
        "fraction=1.0",
        "method.warmup=0.25",
        "method.cvae_hidden=32",
        "method.cvae_latent=8",
        "method.cvae_label_dim=8",
        "method.cvae_epochs=2",
        "optimizer=adam",
        "lr=0.003",
        "local_steps=4",
    ],
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_resumed_run_equals_uninterrupted_run(compose, tiny_overrides, case):
    overrides = [*tiny_overrides, *CASES[case], "rounds=4"]
    full = run_experiment(InProcessGrid(4), compose(*overrides))
    run_dir, grid = crashed_run(compose, overrides)
    assert [r["round"] for r in read_metrics(run_dir)] == [1, 2]
    assert load_checkpoint(run_dir).round == 2
    token = load_checkpoint(run_dir).run_token
    resumed = run_experiment(grid, compose(*overrides, f"resume={run_dir}"))

    a, b = read_metrics(full["run_dir"]), read_metrics(run_dir)
    assert [r["round"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        for key in ROUND_KEYS:
            assert_same(ra[key], rb[key], f"round {ra['round']} {key}")
    for key in ("final_acc", "final_loss", "headline_test_before_acc"):
        assert_same(full[key], resumed[key], key)
    assert resumed["resumed_after_rounds"] == [2] and resumed["run_dir"] == str(run_dir)
    ca, cb = load_checkpoint(full["run_dir"]), load_checkpoint(run_dir)
    assert cb.round == 4 and cb.run_token == token  # the clients' personal state stays found
    sa, sb = ca.decode(), cb.decode()
    for key in ("global_arrays", "rng", "extra", "arch_arrays", "arch_of"):
        assert_same(sa[key], sb[key], key)
    if case == "mixed":
        assert set(sb["arch_arrays"]) == {"lenet5_3fc", "cnn_kapc"}  # besides the default lenet5_1fc
    if case == "fedcmd":
        assert sb["extra"]["state"].personal_layer is not None and len(sb["extra"]["state"].round_winners) == 3
    if case == "fedtsdp":
        assert sb["extra"]["shared_counter"] < len(sb["extra"]["units"]) and len(sb["extra"]["events"]) == 4
    if case == "velo":
        assert sb["extra"]["cvae_trained"] == 4 and any(len(v) for v in sb["extra"]["store"].values())
    if case == "pfedsim":
        assert sb["extra"]["bodies"] and not np.allclose(sb["extra"]["sim"], np.eye(4))


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_fedcmd_resume_right_after_the_phase_switch(compose, tiny_overrides):
    """kp=2: the checkpoint of round 2 holds l*, phi_init and post_init; phase 2 runs after the resume."""
    overrides = [*tiny_overrides, "method=fedcmd", "method.kp=2", "rounds=3"]
    full = run_experiment(InProcessGrid(4), compose(*overrides))
    run_dir, grid = crashed_run(compose, overrides)
    state = load_checkpoint(run_dir).decode()["extra"]["state"]
    assert state.personal_layer is not None and state.phi_init
    resumed = run_experiment(grid, compose(f"resume={run_dir}"))  # the bare form: the rest is the saved config
    assert_same(full["final_acc"], resumed["final_acc"])
    assert_same(read_metrics(full["run_dir"])[-1]["test_before_acc"], read_metrics(run_dir)[-1]["test_before_acc"])


def test_resume_with_more_rounds_and_extra_metrics_lines(compose, tiny_overrides):
    overrides = [*tiny_overrides, "method=fedavg", "rounds=3"]
    run_dir, grid = crashed_run(compose, overrides)
    # a crash between the metrics line of round 3 and its checkpoint, plus a torn line
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"round": 3, "test_before_acc": 0.5}) + "\n" + '{"round": 4, "te')
    summary = run_experiment(grid, compose(f"resume={run_dir}", "rounds=5"))
    assert [r["round"] for r in read_metrics(run_dir)] == [1, 2, 3, 4, 5]
    discarded = (run_dir / "metrics.discarded.jsonl").read_text().splitlines()
    assert len(discarded) == 2 and json.loads(discarded[0])["test_before_acc"] == 0.5  # kept, not deleted
    assert summary["resumed_after_rounds"] == [2] and 0.0 <= summary["headline_test_before_acc"] <= 1.0
    assert "rounds: 5" in (run_dir / "config.yaml").read_text()
    assert load_checkpoint(run_dir).round == 5


def test_resume_errors_say_what_and_how(compose, tiny_overrides, tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        compose(f"resume={tmp_path / 'nowhere'}")
    overrides = [*tiny_overrides, "method=fedavg", "rounds=3"]
    run_dir, grid = crashed_run(compose, overrides)
    with pytest.raises(ConfigError, match=r"only rounds.*lr: given 0.1"):
        compose(f"resume={run_dir}", "lr=0.1")
    with pytest.raises(ConfigError, match="round 2; rounds=1 is fewer"):
        run_experiment(grid, compose(f"resume={run_dir}", "rounds=1"))
    # corrupt checkpoint: named, explained, and nothing in the run directory is touched
    path = run_dir / "checkpoint.npz"
    good = path.read_bytes()
    metrics = (run_dir / "metrics.jsonl").read_text()
    for bad in (b"not a zip at all", good[: len(good) // 2]):
        path.write_bytes(bad)
        with pytest.raises(CheckpointError, match=r"checkpoint\.npz is unreadable.*nothing was changed"):
            run_experiment(grid, compose(f"resume={run_dir}"))
        assert path.read_bytes() == bad and (run_dir / "metrics.jsonl").read_text() == metrics
    path.unlink()
    with pytest.raises(CheckpointError, match="checkpoint.npz does not exist.*start a new run"):
        run_experiment(grid, compose(f"resume={run_dir}"))


def test_a_run_saved_before_a_key_existed_resumes_with_its_command_line(compose, tiny_overrides):
    """A key pflower gained after the run began (absent from its config.yaml) is not a conflict
    when the original command line is repeated, even through `experiment=`; naming that key
    with another value is."""
    from omegaconf import OmegaConf

    overrides = [*tiny_overrides, "method=fedavg", "rounds=3"]
    run_dir, _ = crashed_run(compose, overrides)
    saved = OmegaConf.load(run_dir / "config.yaml")
    del saved.dataset["transfer_fraction"]  # as a run made before FedMD's transfer split was
    OmegaConf.save(saved, run_dir / "config.yaml")
    plan = compose(f"resume={run_dir}", *overrides)
    assert "transfer_fraction" not in OmegaConf.create(plan.record).dataset
    with pytest.raises(ConfigError, match=r"dataset.transfer_fraction: given 0.2"):
        compose(f"resume={run_dir}", *overrides, "dataset.transfer_fraction=0.2")


def test_flwr_run_config_resume_key(compose, tiny_overrides):
    """`flwr run . --run-config "resume='<dir>' rounds=5"`: the ServerApp's path to the same config."""
    from pflower.server_app.config import compose_config, overrides_from_run_config

    assert overrides_from_run_config({"resume": "", "rounds": 30}) == []
    run_dir, _ = crashed_run(compose, [*tiny_overrides, "method=fedper", "rounds=3"])
    overrides = overrides_from_run_config({"method": "fedcmd", "resume": str(run_dir), "rounds": 5})
    assert overrides == [f"resume={run_dir}", "rounds=5"]
    cfg = compose_config(overrides)
    assert cfg.rounds == 5 and cfg.num_clients == 4 and cfg.dataset.name == "synthetic" and cfg.resume == str(run_dir)


def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, {"round": 1, "method": "m", "run_token": "t", "w": np.ones(3)})

    def torn_savez(f, **arrays):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_mod.np, "savez", torn_savez)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, {"round": 2, "method": "m", "run_token": "t", "w": np.zeros(3)})
    monkeypatch.undo()
    ck = load_checkpoint(tmp_path)
    assert ck.round == 1 and np.array_equal(ck.decode()["w"], np.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.npz"]  # no temporary file left


# ---------------------------------------------------------------------- the generic mechanism
def test_a_method_without_declared_state_checkpoints_none(compose, tiny_overrides):
    """The method's state is what its traits declare: FedPer declares none (its config rebuilds it)."""
    assert build(compose(*tiny_overrides, "method=fedper"), "tok").method_state() == {}


@dataclasses.dataclass
class Clusters:
    members: list[list[int]]
    centers: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)


class FutureMethod(FedPer):
    """State shapes of methods still to come (CFL clusters, a cube, a CVAE): declared, no checkpoint code."""

    traits = dataclasses.replace(
        FedPer.traits, state=("cvae", "opt", "gen", "clusters", "cube", "per_client", "pairs", "seen", "alpha")
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cvae = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
        self.opt = torch.optim.Adam(self.cvae.parameters(), lr=0.01)
        self.gen = torch.Generator().manual_seed(3)
        self.clusters = Clusters([list(range(self.run.num_clients))])
        self.cube = np.zeros((self.run.num_clients, self.run.num_clients, 3), dtype=np.float32)
        self.per_client: defaultdict[int, list[float]] = defaultdict(list)
        self.pairs: dict[tuple[int, int], float] = {}
        self.seen: set[int] = set()
        self.alpha = np.float32(0.5)


def test_new_methods_state_is_checkpointed_with_no_code(compose, tiny_overrides, tmp_path, monkeypatch):
    monkeypatch.setitem(STRATEGIES, "fedper", FutureMethod)
    cfg = compose(*tiny_overrides, "method=fedper")
    s = build(cfg, "tok")
    s.clusters = Clusters([[0, 1], [2, 3]], {0: np.ones(2), 1: np.zeros(2)})
    s.cube[1, 2] = [1, 2, 3]
    s.per_client[3].append(0.25)
    s.pairs[(0, 1)] = 0.5
    s.seen |= {2, 0}
    s.alpha = np.float32(0.75)
    loss = s.cvae(torch.randn(5, 4)).pow(2).mean()
    loss.backward()
    s.opt.step()
    s.run.rng.random(3)
    torch.rand(2, generator=s.gen)
    save_checkpoint(tmp_path, s.state_dict())

    fresh = build(cfg, "tok")
    cvae, gen = fresh.cvae, fresh.gen
    fresh.load_state_dict(load_checkpoint(tmp_path).decode(fresh.state_dict()))
    assert fresh.cvae is cvae  # loaded into the live module
    for (k, a), b in zip(s.cvae.state_dict().items(), fresh.cvae.state_dict().values()):
        assert torch.equal(a, b), k
    assert fresh.opt.state_dict()["state"][0]["exp_avg"].equal(s.opt.state_dict()["state"][0]["exp_avg"])
    assert fresh.clusters.members == [[0, 1], [2, 3]] and np.array_equal(fresh.clusters.centers[0], np.ones(2))
    assert np.array_equal(fresh.cube, s.cube) and fresh.cube.dtype == np.float32
    assert isinstance(fresh.per_client, defaultdict) and fresh.per_client[3] == [0.25] and fresh.per_client[9] == []
    assert fresh.pairs == {(0, 1): 0.5} and fresh.seen == {0, 2}
    assert fresh.alpha == np.float32(0.75) and isinstance(fresh.alpha, np.float32)
    assert fresh.run.rng.random() == s.run.rng.random()
    assert fresh.gen is gen and torch.equal(torch.rand(3, generator=fresh.gen), torch.rand(3, generator=s.gen))


def test_unencodable_state_fails_before_round_one_naming_the_attribute(compose, tiny_overrides, monkeypatch):
    class Bad(FedPer):
        traits = dataclasses.replace(FedPer.traits, state=("handle",))

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.handle = open(__file__)  # noqa: SIM115

    monkeypatch.setitem(STRATEGIES, "fedper", Bad)
    grid = InProcessGrid(4)
    with pytest.raises(CheckpointError, match=r"state\.extra\.handle .*traits\.state"):
        run_experiment(grid, compose(*tiny_overrides, "method=fedper"))
    assert not grid.sent  # nothing was trained
    Bad.traits = FedPer.traits  # configuration, not state: rebuilt from the config on resume
    run_experiment(InProcessGrid(4), compose(*tiny_overrides, "method=fedper", "rounds=1"))


def test_state_created_during_the_run_must_be_declared_and_says_so(compose, tiny_overrides, monkeypatch):
    """An attribute a method sets after the run started is state resume would lose: the first
    checkpoint refuses it by name, unless declared (saved) or private (per-round scratch)."""

    class Lazy(FedPer):
        def aggregate(self, server_round, updates):
            self.seen_rounds = server_round  # undeclared state
            self._scratch = server_round  # private: per-round scratch, never saved
            return super().aggregate(server_round, updates)

    monkeypatch.setitem(STRATEGIES, "fedper", Lazy)
    with pytest.raises(CheckpointError, match=r"\['seen_rounds'\] after the run started.*traits\.state"):
        run_experiment(InProcessGrid(4), compose(*tiny_overrides, "method=fedper", "rounds=2"))

    class Declared(Lazy):
        traits = dataclasses.replace(FedPer.traits, state=("seen_rounds",))

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.seen_rounds = 0  # declared state exists from construction (a resume loads into it)

    monkeypatch.setitem(STRATEGIES, "fedper", Declared)
    summary = run_experiment(InProcessGrid(4), compose(*tiny_overrides, "method=fedper", "rounds=2"))
    assert load_checkpoint(summary["run_dir"]).decode()["extra"] == {"seen_rounds": 2}


def test_a_checkpoint_of_other_declared_state_is_refused(compose, tiny_overrides, tmp_path, monkeypatch):
    class Declares(FedPer):
        traits = dataclasses.replace(FedPer.traits, state=("counter",))

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.counter = 0

    cfg = compose(*tiny_overrides, "method=fedper")
    save_checkpoint(tmp_path, build(cfg, "tok").state_dict())  # FedPer: no state
    monkeypatch.setitem(STRATEGIES, "fedper", Declares)
    fresh = build(cfg, "tok")
    with pytest.raises(CheckpointError, match=r"holds Declares state \[\], this version declares \['counter'\]"):
        fresh.load_state_dict(load_checkpoint(tmp_path).decode(fresh.state_dict()))


def test_codec_round_trip_and_refusals():
    value = {
        "a": (1, 2.5, np.float32(3), float("nan")),
        3: {4, 5},
        "t": torch.arange(3, dtype=torch.bfloat16),
        "__x": [np.int64(7), None, "s", True],
        "f": frozenset({"x"}),
        "big": 2**80,
    }
    arrays: dict = {}
    tree = encode(value, arrays)
    json.dumps(tree)  # JSON-safe
    back = decode(json.loads(json.dumps(tree)), arrays)
    assert back["a"][:3] == (1, 2.5, np.float32(3)) and np.isnan(back["a"][3]) and type(back["a"][2]) is np.float32
    assert back[3] == {4, 5} and back["f"] == frozenset({"x"}) and back["big"] == 2**80
    assert back["t"].dtype == torch.bfloat16 and back["t"].tolist() == [0, 1, 2]
    assert back["__x"] == [7, None, "s", True] and type(back["__x"][0]) is np.int64
    with pytest.raises(CheckpointError, match=r"state\.o"):
        encode({"o": np.array([object()], dtype=object)}, {})
    with pytest.raises(CheckpointError, match="does not rebuild"):
        decode({"__object__": "os:system", "fields": {}}, {})


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_resume_in_a_new_simulation_with_client_state_dir_auto(compose, tiny_overrides):
    """A new Ray simulation starts with empty client contexts: client_state_dir=auto keeps FedPer's heads."""
    overrides = [*tiny_overrides, "method=fedper", "rounds=4", "client_state_dir=auto", "fraction=1.0"]
    full = run_experiment(InProcessGrid(4), compose(*overrides))
    run_dir, _ = crashed_run(compose, overrides)
    assert sorted(p.name for p in (run_dir / "client_state").rglob("*.pt")) == [f"client_{i}.pt" for i in range(4)]
    resumed = run_experiment(InProcessGrid(4), compose(*overrides, f"resume={run_dir}"))  # fresh contexts
    for ra, rb in zip(read_metrics(full["run_dir"]), read_metrics(run_dir)):
        assert_same(ra["test_before_acc"], rb["test_before_acc"], f"round {ra['round']}")
    assert_same(full["final_acc"], resumed["final_acc"], "final_acc")


@pytest.mark.parametrize(
    "extra, crash_at, same_nodes",
    [
        ([], 3, True),  # SuperNodes that stay up: the state in their contexts
        (["checkpoint_every=2", "client_state_dir=auto"], 4, False),  # rounds 3-4 replayed, state from files
    ],
)
@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_crash_after_the_clients_saved_a_round_resumes_exactly(compose, tiny_overrides, extra, crash_at, same_nodes):
    """The clients already saved the lost round(s); the replay starts each from the state before it."""
    overrides = [*tiny_overrides, "method=fedper", "rounds=4", "fraction=1.0", *extra]
    full = run_experiment(InProcessGrid(4), compose(*overrides))
    run_dir, grid = crashed_run(compose, overrides, crash_at=crash_at, after_replies=True)
    assert load_checkpoint(run_dir).round == 2
    resumed = run_experiment(grid if same_nodes else InProcessGrid(4), compose(*overrides, f"resume={run_dir}"))
    for ra, rb in zip(read_metrics(full["run_dir"]), read_metrics(run_dir), strict=True):
        for key in ROUND_KEYS:
            assert_same(ra[key], rb[key], f"round {ra['round']} {key}")
    assert_same(full["final_acc"], resumed["final_acc"], "final_acc")


# ----------------------------------------------------------------------------- every method's own server state
NEW = ("fedamp", "cfl", "feddyn", "fedfomo", "fedap", "moon", "pfedla")


# ----------------------------------------------------------------------------- server state
@pytest.mark.parametrize("method", NEW)
@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_extra_state_is_plain_and_restores_the_server_state(compose, tiny_overrides, method):
    extra = {"fedap": ["method.warmup=1"], "cfl": ["method.start_round=1", "method.eps1=100", "method.eps2=0"]}.get(
        method, []
    )
    args = (compose, tiny_overrides, f"method={method}", "fraction=1.0", *extra)
    _, strategy = make(*args)
    grid = InProcessGrid(4)
    run(strategy, grid, rounds=2)
    arrays: dict[str, np.ndarray] = {}
    encoded = encode(strategy.method_state(), arrays)  # checkpointable: plain values and arrays only
    _, fresh = make(*args)
    fresh.model.global_arrays = copy.deepcopy(strategy.model.global_arrays)
    for key, value in decode(encoded, arrays, fresh.method_state()).items():
        setattr(fresh, key, value)
    for cid in range(4):
        if method == "fedfomo":
            assert fresh.choose(cid) == strategy.choose(cid)
            continue
        down, again = strategy.downlinks([cid], 3)[cid], fresh.downlinks([cid], 3)[cid]
        extra_down, extra_again = strategy.extra_downlinks([cid], 3)[cid], fresh.extra_downlinks([cid], 3)[cid]
        assert set(down) == set(again) and all(np.array_equal(down[k], again[k]) for k in down)
        assert set(extra_down) == set(extra_again) and all(
            np.array_equal(extra_down[k], extra_again[k]) for k in extra_down
        )


def test_numpy_generators_are_checkpointed_by_their_state():
    rng = np.random.default_rng(7)
    rng.random(5)
    arrays: dict = {}
    tree = encode({"g": rng, "nested": [np.random.Generator(np.random.MT19937(3))]}, arrays)
    expected = rng.random(3)
    fresh = decode(tree, arrays)  # no live generator: rebuilt from the state
    np.testing.assert_array_equal(fresh["g"].random(3), expected)
    assert isinstance(fresh["nested"][0].bit_generator, np.random.MT19937)
    live = np.random.default_rng(0)
    assert decode(tree, arrays, {"g": live, "nested": [None]})["g"] is live  # loaded into the live one
    tree["g"]["__generator__"] = "Nope"
    with pytest.raises(CheckpointError, match="bit generator"):
        decode(tree, arrays)
