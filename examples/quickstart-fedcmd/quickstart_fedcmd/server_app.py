"""quickstart-fedcmd: a Flower ServerApp running pflower's FedCMD."""

import json

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from pflower.strategies import FedCMD, client_spec
from quickstart_fedcmd.task import Net

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""

    # Read run config
    num_rounds: int = context.run_config["num-server-rounds"]
    fraction_train: float = context.run_config["fraction-train"]
    num_clients = len(list(grid.get_node_ids())) or 10

    # Initialize FedCMD: phase 1 (kp rounds) trains the whole model and the clients vote for the
    # layer to personalize; from then on that layer stays on each client
    strategy = FedCMD(
        Net(),
        client_spec(lr=context.run_config["lr"], local_epochs=context.run_config["local-epochs"]),
        num_clients=num_clients,
        fraction_train=fraction_train,
        kp=context.run_config["phase-one-rounds"],
    )

    # Start strategy, run FedCMD for `num_rounds`
    strategy.start(grid=grid, num_rounds=num_rounds)

    # What FedCMD chose, and the clients' accuracy on their own test splits
    print("quickstart-fedcmd:", json.dumps({"personal_layer": strategy.personal_layer(), **strategy.final_metrics}))
