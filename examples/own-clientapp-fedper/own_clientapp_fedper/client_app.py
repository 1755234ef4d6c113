"""own-clientapp-fedper: a ClientApp of its own (plain Flower and PyTorch) that pflower's FedPer can drive.

What it must do is pflower's message contract (docs/api.md): answer discovery (a train message
whose config says `task: query`) with its client id and data sizes; in a train message, load the
arrays it gets, train with the message's `lr` / `local-epochs` / `batch-size`, keep what it does
not send back (FedPer: the head) and reply with exactly the `upload-keys`; in an evaluate message,
report its test counts. The one pflower import is `adapt`, which gives Net the state-dict keys
pflower's strategies use (`groups.<child>.<tensor>`: conv1 ... fc3 are the layer groups).
"""

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch.utils.data import DataLoader

from own_clientapp_fedper.task import Net, load_data
from pflower.models import adapt

app = ClientApp()


def my_data(context: Context):
    return load_data(context.node_config["partition-id"], context.node_config["num-partitions"])


def my_model(context: Context) -> torch.nn.Module:
    """The model with the tensors the server sent and those this client kept (FedPer's head)."""
    torch.manual_seed(0)  # every client starts from the same weights
    model = adapt(Net())
    if "kept" in context.state.array_records:
        model.load_state_dict(context.state.array_records["kept"].to_torch_state_dict(), strict=False)
    return model


def test_counts(model: torch.nn.Module, test) -> tuple[int, float]:
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for x, y in DataLoader(test, batch_size=64):
            out = model(x)
            correct += int((out.argmax(1) == y).sum())
            loss += float(F.cross_entropy(out, y, reduction="sum"))
    return correct, loss


def hello(msg: Message, context: Context) -> Message:
    """pflower's discovery: who this client is and how much data it holds."""
    train, test = my_data(context)
    metrics = {"client-id": context.node_config["partition-id"], "num-train": len(train), "num-test": len(test)}
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    if config.get("task") == "query":  # discovery arrives as a train message
        return hello(msg, context)
    model = my_model(context)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict(), strict=False)
    train_set, test_set = my_data(context)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    model.train()
    for _ in range(config["local-epochs"]):
        for x, y in DataLoader(train_set, batch_size=config["batch-size"], shuffle=True):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    state = model.state_dict()
    upload = list(config["upload-keys"])
    context.state["kept"] = ArrayRecord({k: v for k, v in state.items() if k not in upload})  # the head
    correct, loss = test_counts(model, test_set)
    metrics = {
        "client-id": context.node_config["partition-id"],
        "num-examples": len(train_set),  # must equal the num-train it announced
        "test_size": len(test_set),
        "test_after_correct": correct,
        "test_after_loss_sum": loss,
    }
    reply = RecordDict({"arrays": ArrayRecord({k: state[k] for k in upload}), "metrics": MetricRecord(metrics)})
    return Message(reply, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    model = my_model(context)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict(), strict=False)
    train_set, test_set = my_data(context)
    correct, loss = test_counts(model, test_set)
    metrics = {
        "client-id": context.node_config["partition-id"],
        "num-examples": len(train_set),
        "test_size": len(test_set),
        "test_correct": correct,
        "test_loss_sum": loss,
    }
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
