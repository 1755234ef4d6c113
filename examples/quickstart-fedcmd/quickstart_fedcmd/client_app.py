"""quickstart-fedcmd: the ClientApp is pflower's client side on the app's own model and data."""

from flwr.app import Context

from pflower.client_app import build_clientapp
from quickstart_fedcmd.task import Net, load_data


def data(context: Context):
    # simulation: Flower's partition-id; a SuperNode: its --node-config "client-id=<i> num-partitions=<n>"
    node = context.node_config
    return load_data(int(node.get("partition-id", node.get("client-id", 0))), int(node["num-partitions"]))


# Construct the ClientApp: pflower answers the strategy's messages (its discovery query, train with
# FedCMD's layer votes, evaluate) on Net, its layer groups being Net's children (conv1 ... fc3)
app = build_clientapp(model=Net, data=data)
