"""The pflower ServerApp (component ``server_app.app:app``) for `flwr run`."""

from __future__ import annotations

import sys
from logging import INFO
from pathlib import Path

from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from pflower.logs import quiet_flower_logs

from .config import overrides_from_run_config
from .failures import one_line_errors
from .run_plan import plan_run
from .runner import prepare_run, run_experiment
from .superlink import check_superlink_checkout

APP_DIR = Path(__file__).resolve().parents[1]  # under `flwr run`: the unpacked FAB

quiet_flower_logs()
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Plan the run from the run-config (conf/ composed with it, as ``pflower sim`` plans),
    prepare it (its strategy built once), then run it.

    A bad key or value, a checkpoint that cannot be resumed, or a federation that does not fit
    the config (e.g. 20 SuperNodes for num_clients=10) is one ``pflower:`` line in the run's log
    and the run ends as failed, with no run directory left behind.
    """
    with one_line_errors():
        if Path(sys.argv[0]).name == "flwr-simulation":  # a local SuperLink's run: is it this checkout's?
            check_superlink_checkout(APP_DIR, Path.cwd())
        plan = plan_run(overrides_from_run_config(dict(context.run_config)))
        prepared = prepare_run(plan)  # the strategy built once; a bad option: one line
        output_dir = prepared.plan.run.output_dir
        if not Path(output_dir).expanduser().is_absolute():
            # the ServerApp runs in the SuperLink's working directory, not the one `flwr run` ran in
            log(
                INFO,
                "pflower: output_dir=%s is relative to the SuperLink's working directory %s "
                "(`pflower superlink status`); to write elsewhere pass output_dir='<absolute path>'",
                output_dir,
                Path.cwd(),
            )
        run_experiment(grid, prepared)
