"""own-clientapp-fedper: a Flower ServerApp running pflower's FedPer (the head stays on each client)."""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from own_clientapp_fedper.task import Net
from pflower.strategies import FedPer, client_spec

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    num_clients = len(list(grid.get_node_ids())) or 10
    strategy = FedPer(Net(), client_spec(lr=context.run_config["lr"]), num_clients=num_clients, fraction_train=1.0)
    strategy.start(grid=grid, num_rounds=context.run_config["num-server-rounds"])
    print(f"own-clientapp-fedper: final accuracy {strategy.final_metrics['final_acc']:.4f}")
