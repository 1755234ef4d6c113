"""A round in which every client's ClientApp fails stops the run with one line naming the round
and the error; some clients failing, or nodes out of reach, are dropped and the run goes on.

Found on a GPU machine: workers forked after the parent had asked for CUDA failed every client
at its first CUDA call, and the run went on to write ten rounds of an untrained model, exit 0."""

from __future__ import annotations

from pathlib import Path

import pytest
from flwr.app import Error, Message
from flwr.common.constant import ErrorCode

from pflower.server_app.failures import USER_ERRORS
from pflower.server_app.results import read_metrics
from pflower.server_app.runner import run_experiment
from pflower.simulation.inprocess import InProcessGrid, error_reply
from pflower.strategies.base.replies import ClientsFailed

BASE = ["method=fedavg", "rounds=3", "fraction=1.0"]


class FailingGrid(InProcessGrid):
    """From round ``from_round`` on, the train replies of ``clients`` (None: all) are replaced by
    ``reply(msg)``: an exception in the ClientApp by default."""

    def __init__(self, *args, from_round: int, clients: set[int] | None = None, reply=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.from_round, self.clients = from_round, clients
        self.reply = reply or (lambda msg: error_reply(msg, RuntimeError("CUDA error: initialization error")))

    def handle_all(self, tasks):
        replies = super().handle_all(tasks)
        out = []
        for (msg, node), reply in zip(tasks, replies):
            config = msg.content.config_records.get("config") or {}
            hit = (
                msg.metadata.message_type == "train"
                and int(config.get("server-round", 0)) >= self.from_round
                and (self.clients is None or self.contexts[node].node_config["partition-id"] in self.clients)
            )
            out.append(self.reply(msg) if hit else reply)
        return out


def run_dirs(cfg) -> list[Path]:
    return [p for p in Path(cfg.run.output_dir).glob("*/*") if p.is_dir()]


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_every_client_failing_stops_the_run_and_keeps_what_was_written(compose, tiny_overrides):
    cfg = compose(*tiny_overrides, *BASE)
    with pytest.raises(ClientsFailed) as stopped:
        run_experiment(FailingGrid(4, from_round=2), cfg)
    text = str(stopped.value)
    assert text.startswith("round 2: the ClientApp of every client asked to train failed (4 of 4")
    assert "client 0: RuntimeError: CUDA error: initialization error" in text
    assert isinstance(stopped.value, USER_ERRORS)  # one `pflower:` line, exit status 2
    (run_dir,) = run_dirs(cfg)
    # pflower's own run names its checkpoint; the strategy alone (a library user's app) says nothing of resume
    assert text.endswith(f"; the run continues from its checkpoint of round 1 with resume={run_dir}")
    assert "resume" not in str(stopped.value.__cause__)
    assert [r["round"] for r in read_metrics(run_dir)] == [1]  # round 1 kept, nothing of round 2 written
    assert (run_dir / "checkpoint.npz").exists()


def test_failing_in_round_one_leaves_no_run_directory(compose, tiny_overrides):
    cfg = compose(*tiny_overrides, *BASE)
    with pytest.raises(ClientsFailed, match="^round 1: ") as stopped:
        run_experiment(FailingGrid(4, from_round=1), cfg)
    assert run_dirs(cfg) == [] and "resume" not in str(stopped.value)  # nothing to resume


def test_some_clients_failing_are_dropped_and_the_run_goes_on(compose, tiny_overrides):
    cfg = compose(*tiny_overrides, *BASE)
    summary = run_experiment(FailingGrid(4, from_round=1, clients={1, 2}), cfg)
    rounds = read_metrics(summary["run_dir"])
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert all(r["clients"] == [0, 3] for r in rounds)


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_nodes_out_of_reach_are_not_a_clientapp_failure(compose, tiny_overrides):
    """Every node unreachable (the network's, not the code's): the rounds are skipped as before."""
    cfg = compose(*tiny_overrides, *BASE)
    unreachable = lambda msg: Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="Node Unavailable"), reply_to=msg)  # noqa: E731
    summary = run_experiment(FailingGrid(4, from_round=2, reply=unreachable), cfg)
    rounds = read_metrics(summary["run_dir"])
    assert [r["round"] for r in rounds] == [1, 2, 3] and rounds[1]["clients"] == [] and rounds[1].get("skipped")
