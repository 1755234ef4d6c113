"""``client_mod``: Flower's quickstart ClientApp, its own train and evaluate functions unchanged,
driven by pflower strategies through Flower's mod mechanism (here on an in-process grid that
calls the ClientApp object as a SuperNode does)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from pflower.client_app import client_mod
from pflower.client_app.runtime import handle_hello
from pflower.client_app.state import context_versions
from pflower.client_app.user_parts import ClientHooks
from pflower.simulation.inprocess import InProcessGrid, error_reply
from pflower.strategies import STRATEGIES, FedAvg, FedCMD, FedCPMD, FedPer, FedProx, client_spec
from pflower.strategies.base.client_directory import FederationError
from pflower.strategies.base.client_spec import SetupError

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart-pytorch"
sys.path.insert(0, str(QUICKSTART))
from quickstart_pytorch import client_app as quickstart  # noqa: E402
from quickstart_pytorch.task import Net, load_data  # noqa: E402

RUN_CONFIG = {"batch-size": 32, "local-epochs": 1, "lr": 0.05}


@pytest.fixture(autouse=True)
def task_identity():
    """What a process running a ServerApp or ClientApp has set before it builds a Message."""
    InProcessGrid(1)


def data(context: Context):
    return load_data(context.node_config["partition-id"], context.node_config["num-partitions"], 32)


class AppGrid(InProcessGrid):
    """Nodes that run a Flower ClientApp object (mods included), its exceptions as error replies."""

    discovery_type = "train"  # what a real Grid gets (flwr run, SuperNodes)

    def __init__(self, app: ClientApp, num_nodes: int = 3) -> None:
        super().__init__(num_nodes)
        self.app, self.types = app, []
        for ctx in self.contexts.values():
            ctx.run_config = dict(RUN_CONFIG)

    def handle_all(self, tasks: list[tuple[Message, int]]) -> list[Message]:
        replies = []
        for msg, node in tasks:
            self.types.append(msg.metadata.message_type)
            try:
                replies.append(self.app(msg, self.contexts[node]))
            except Exception as exc:  # noqa: BLE001 - as Flower's ClientApp runner does
                replies.append(error_reply(msg, exc))
        return replies


def quickstart_app(calls: list[str] | None = None, **mod_kwargs) -> ClientApp:
    """The quickstart's ClientApp with the mod: its own train and evaluate functions registered."""
    app = ClientApp(mods=[client_mod(model=Net, data=mod_kwargs.pop("data", data), **mod_kwargs)])

    def train(msg: Message, context: Context) -> Message:
        if calls is not None:
            calls.append("train")
        return quickstart.train(msg, context)

    app.train()(train)
    app.evaluate()(quickstart.evaluate)
    return app


def test_a_clientapp_that_fails_the_train_typed_discovery_is_asked_again_with_a_query():
    """An app written to the earlier contract (its train function expects a round; it answers a
    query message) still joins: its error to the first ask is followed by a query."""

    def hand_written_train(msg: Message, context: Context) -> Message:
        raise KeyError("upload-keys")

    app = ClientApp()
    app.train()(hand_written_train)
    app.query()(lambda msg, context: handle_hello(msg, context, ClientHooks(Net, data)))
    grid = AppGrid(app)
    strategy = FedAvg(Net(), client_spec(lr=0.05), num_clients=3, fraction_train=1.0)
    strategy.discover(grid, wait_for=3, timeout=5)
    assert sorted(strategy.clients) == [0, 1, 2] and grid.types == ["train"] * 3 + ["query"] * 3


def test_a_clientapp_without_the_mod_is_refused_with_what_to_add():
    """Issue 76 (3): the quickstart's ClientApp as it is (no mod) under a pflower strategy: not the
    user's KeyError and Flower's "No query function registered", but what to add."""
    app = ClientApp()
    app.train()(quickstart.train)
    strategy = FedAvg(Net(), client_spec(lr=0.05), num_clients=3, fraction_train=1.0)
    with pytest.raises(FederationError) as refused:
        strategy.discover(AppGrid(app), wait_for=3, timeout=5)
    text = str(refused.value)
    assert text.startswith("no client could join the run: node 1000: its ClientApp does not speak pflower's")
    assert "client_mod(model=Net, data=load_data)" in text and "build_clientapp(" in text and "'arrays'" in text


@pytest.mark.heavy  # over 1 s of one core: not in the quick tier
def test_a_data_function_whose_one_parameter_has_another_name_gets_the_context():
    """Issue 76 (3): `client_mod(data=lambda c: ...)` was a TypeError (missing 'c'); one parameter of
    any name now receives the context, as `context` does."""
    seen: list[Context] = []

    def by_another_name(c):
        seen.append(c)
        return data(c)

    grid = AppGrid(quickstart_app(data=by_another_name))
    strategy = FedPer(Net(), client_spec(lr=0.05), num_clients=3, fraction_train=1.0)
    strategy.start(grid, num_rounds=1)
    assert strategy.final_metrics["final_clients"] == 3 and seen and all(isinstance(c, Context) for c in seen)


def test_fedper_drives_the_quickstarts_own_train_function_and_keeps_the_head_on_each_node():
    calls: list[str] = []
    grid = AppGrid(quickstart_app(calls))
    strategy = FedPer(Net(), client_spec(lr=0.05), num_clients=3, fraction_train=1.0)
    result = strategy.start(grid=grid, num_rounds=1)
    assert calls == ["train"] * 3  # the app's own function trained every client
    assert grid.types[:6] == ["train"] * 6  # discovery is a train message: the mod answers it
    assert strategy.final_metrics["final_clients"] == 3 and strategy.final_metrics["final_acc"] > 0.15
    assert set(result.arrays) == set(Net().state_dict())  # Flower's names
    heads = [context_versions(ctx)[1]["groups.fc3.weight"] for ctx in grid.contexts.values()]
    assert len(heads) == 3 and not torch.equal(heads[0], heads[1])  # each node keeps its own trained head


def test_fedcmd_votes_on_the_model_the_apps_train_function_returned():
    grid = AppGrid(quickstart_app())
    strategy = FedCMD(
        Net(), client_spec(lr=0.05), num_clients=3, fraction_train=1.0, kp=1, selection_timing="after_training"
    )
    strategy.start(grid=grid, num_rounds=2)
    assert strategy.personal_layer() in {"conv1", "conv2", "fc1", "fc2", "fc3"}
    assert strategy.run.history[0].get("voted_clients", 3) == 3 and strategy.run.history[1]["personal_layer"]


def test_fedcpmd_runs_under_the_mod_and_the_apps_train_runs_once_per_trained_client():
    calls: list[str] = []
    grid = AppGrid(quickstart_app(calls), num_nodes=4)
    strategy = FedCPMD(
        Net(), client_spec(lr=0.05), num_clients=4, fraction_train=0.5, kp=1, selection_timing="after_training"
    )
    strategy.start(grid=grid, num_rounds=3)
    assert strategy.final_metrics["final_clients"] == 4
    assert calls.count("train") == sum(len(r["clients"]) for r in strategy.run.history)


@pytest.mark.parametrize(
    ("method", "extra", "needle"),
    [
        (FedCMD, {"kp": 1}, "selection_timing='after_training'"),
        (FedProx, {}, "role 'proximal'"),
    ],
)
def test_a_method_whose_client_trains_its_own_way_is_refused_in_one_line(method, extra, needle):
    strategy = method(Net(), client_spec(lr=0.05), num_clients=3, fraction_train=1.0, **extra)
    with pytest.raises(FederationError) as err:
        strategy.start(grid=AppGrid(quickstart_app()), num_rounds=2)  # kp=1 needs a second round
    text = str(err.value)
    assert needle in text and "build_clientapp" in text and "\n" not in text
    # issue 76 (2): the reply is the one line, not the mod's traceback; the traceback is in the file it names
    assert "ModError" not in text and "Traceback" not in text
    logged = Path(text.split("(traceback: ", 1)[1].split(")", 1)[0])
    assert "Traceback (most recent call last)" in logged.read_text() and "NotImplementedError" not in logged.read_text()


def test_any_failure_of_a_library_clientapp_is_one_line_with_its_traceback_in_a_file(tmp_path, monkeypatch):
    """client_app.failures: the app's own train function raising (a KeyError of the user's code) is
    an error reply naming the exception and the file; only_user_errors lets other failures raise."""
    import tempfile

    from pflower.client_app.failures import one_line_failures

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def broken(msg, context):
        raise KeyError("arrays")

    grid = InProcessGrid(1)
    ctx = next(iter(grid.contexts.values()))
    msg = Message(RecordDict(), message_type="train", dst_node_id=ctx.node_id, group_id="3")
    reply = one_line_failures(broken)(msg, ctx)
    assert (
        reply.has_error()
        and reply.error.reason == f"KeyError: 'arrays' (traceback: {tmp_path}/pflower-clientapp-1.log)"
    )
    assert "train message of round 3" in (tmp_path / "pflower-clientapp-1.log").read_text()
    with pytest.raises(KeyError):
        one_line_failures(broken, only_user_errors=True)(msg, ctx)


def test_a_data_function_that_is_not_what_the_app_trains_on_is_refused():
    half = lambda context: tuple(torch.utils.data.Subset(d.dataset, range(50)) for d in data(context))  # noqa: E731
    strategy = FedAvg(Net(), client_spec(lr=0.05), num_clients=3, fraction_train=1.0)
    with pytest.raises(FederationError, match=r"trained on \d+ samples, but client_mod's data function gives client"):
        strategy.start(grid=AppGrid(quickstart_app(data=half)), num_rounds=1)


def test_a_message_from_a_strategy_that_is_not_pflowers_reaches_the_apps_function():
    app = quickstart_app()
    content = RecordDict({"arrays": ArrayRecord(Net().state_dict()), "config": ConfigRecord({"lr": 0.01})})
    msg = Message(content, message_type="train", dst_node_id=1)
    ctx = Context(
        run_id=1,
        node_id=1,
        node_config={"partition-id": 0, "num-partitions": 3},
        state=RecordDict(),
        run_config=dict(RUN_CONFIG),
    )
    reply = app(msg, ctx)
    assert set(reply.content["arrays"]) == set(Net().state_dict()) and "train_loss" in reply.content["metrics"]


def test_initial_arrays_take_the_models_own_names_and_flowers_train_config_may_repeat_the_spec():
    net = Net()
    torch.nn.init.constant_(net.fc3.bias, 0.5)
    strategy = FedAvg(Net(), client_spec(lr=0.05), num_clients=3, fraction_train=1.0)
    result = strategy.start(
        grid=AppGrid(quickstart_app()),
        initial_arrays=ArrayRecord(net.state_dict()),
        num_rounds=1,
        train_config=ConfigRecord({"lr": 0.05}),
    )
    assert strategy.run.history[0]["test_before_acc"] < 0.25  # round 1 started from the given weights: one class
    Net().load_state_dict(result.arrays.to_torch_state_dict())  # Flower's names, every tensor


def test_initial_arrays_with_a_tensor_the_model_lacks_or_another_shape_are_refused():
    strategy = FedAvg(Net(), client_spec(), num_clients=3)
    with pytest.raises(SetupError, match="'head.weight', which the model does not have"):
        strategy.start(grid=InProcessGrid(3), initial_arrays=ArrayRecord({"head.weight": torch.zeros(2)}))
    with pytest.raises(SetupError, match=r"initial_arrays\['fc3.bias'\] has shape \[3\]; the model's is \[10\]"):
        strategy.start(grid=InProcessGrid(3), initial_arrays=ArrayRecord({"fc3.bias": torch.zeros(3)}))


def test_a_train_config_that_differs_from_the_client_spec_is_refused():
    strategy = FedAvg(Net(), client_spec(lr=0.05), num_clients=3)
    with pytest.raises(ValueError, match="train_config sets .*set them there"):
        strategy.start(grid=InProcessGrid(3), train_config=ConfigRecord({"lr": 0.1}))


def test_metric_record_of_the_reply_keeps_the_apps_train_loss():
    grid = AppGrid(quickstart_app())
    strategy = FedAvg(Net(), client_spec(lr=0.05), num_clients=3, fraction_train=1.0)
    strategy.start(grid=grid, num_rounds=1)
    train_replies = [r for r in grid.replies if "test_after_correct" in r.content["metrics"]]
    assert train_replies and all(isinstance(r.content["metrics"], MetricRecord) for r in train_replies)
    assert all(r.content["metrics"]["train_loss"] > 0 for r in train_replies)


@pytest.mark.slow
def test_the_methods_docs_api_lists_for_the_mod_are_those_that_run_under_it():
    """Every method, one round on the quickstart app with the mod: those that run are the list on
    docs/api.md; the others stop with the mod's one line naming build_clientapp (FedAP and FedMD
    refuse this model or data before that: no BatchNorm, no transfer split)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    listed = text.split("<!-- client-mod-methods -->")[1].split("<!--")[0].replace(" and ", ", ")
    documented = {name.strip().lower().replace("-", "") for name in listed.split(",")}
    ran, refused = set(), {}
    for name, cls in sorted(STRATEGIES.items()):
        # FedCMD and FedCPMD: one round of each phase (a run as long as its phase 1 is refused)
        two_phases = name in ("fedcmd", "fedcpmd")
        extra = {"selection_timing": "after_training", "kp": 1} if two_phases else {}
        try:
            strategy = cls(Net(), client_spec(lr=0.05), num_clients=2, fraction_train=1.0, **extra)
            strategy.start(grid=AppGrid(quickstart_app(), num_nodes=2), num_rounds=2 if two_phases else 1)
            ran.add(name)
        except (FederationError, SetupError, ValueError) as exc:
            refused[name] = str(exc)
    assert ran == documented, (ran, documented)
    for name, reason in refused.items():
        assert "build_clientapp" in reason or name in ("fedap", "fedmd"), (name, reason)


def test_docs_api_shows_the_fedper_switch_as_the_example_has_it():
    diff = (QUICKSTART / "switch" / "fedper.diff").read_text()
    assert f"```diff\n{diff}```" in (QUICKSTART.parents[1] / "docs" / "api.md").read_text()


@pytest.mark.heavy  # over 1 s: the example reads its data for every message
def test_the_hand_written_contract_example_runs_fedper_with_every_reply_accepted():
    """examples/own-clientapp-fedper: a ClientApp of plain Flower and PyTorch written to the
    message contract (it answers the train-typed discovery itself), three rounds of FedPer."""
    sys.path.insert(0, str(QUICKSTART.parent / "own-clientapp-fedper"))
    from own_clientapp_fedper.client_app import app

    strategy = FedPer(Net(), client_spec(lr=0.05), num_clients=3, fraction_train=1.0)
    grid = AppGrid(app)
    strategy.start(grid=grid, num_rounds=3)
    assert grid.types[:3] == ["train"] * 3  # discovery answered on the first ask
    assert all(not r["dropped"] and r["clients"] == [0, 1, 2] for r in strategy.run.history), strategy.run.history
    assert strategy.final_metrics["final_clients"] == 3
