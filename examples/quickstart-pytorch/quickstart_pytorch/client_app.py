"""quickstart-pytorch: the ClientApp (Flower's message API: a train and an evaluate function)."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from quickstart_pytorch.task import Net, load_data
from quickstart_pytorch.task import test as test_fn
from quickstart_pytorch.task import train as train_fn

app = ClientApp()


@app.train()
def train(msg: Message, context: Context):
    """Train the received model on this node's data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    trainloader, _ = load_data(partition_id, num_partitions, context.run_config["batch-size"])
    train_loss = train_fn(model, trainloader, context.run_config["local-epochs"], msg.content["config"]["lr"], device)
    metrics = MetricRecord({"train_loss": train_loss, "num-examples": len(trainloader.dataset)})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    """Evaluate the received model on this node's test split."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    _, testloader = load_data(partition_id, num_partitions, context.run_config["batch-size"])
    eval_loss, eval_acc = test_fn(model, testloader, device)
    metrics = MetricRecord({"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": len(testloader.dataset)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
