"""The pflower ServerApp (component ``server_app.app:app``) for `flwr run`."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from .config import compose_config, overrides_from_run_config
from .runner import run_experiment

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Compose conf/ with the run-config, then run the experiment."""
    cfg = compose_config(overrides_from_run_config(dict(context.run_config)))
    run_experiment(grid, cfg)
