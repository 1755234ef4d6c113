"""One experiment on a Grid: validate, build model + strategy, run, write results, print the summary."""

from __future__ import annotations

import time
import uuid
from logging import INFO
from typing import Any

from flwr.common import log
from flwr.serverapp import Grid
from omegaconf import DictConfig

from client_app.data import DataSpec, partition_sizes
from client_app.data.partition import PartitionError
from models import build_model
from strategies import PersonalizedStrategy, build_strategy
from strategies.evaluation import summarize

from .config import ConfigError, client_spec, data_spec_dict, method_args
from .results import RunWriter, make_run_dir


def check_data(cfg: DictConfig) -> list[int]:
    """Build the partition once on the server (simulation shares the data): fail before round 1."""
    try:
        return partition_sizes(DataSpec.from_dict(data_spec_dict(cfg)))
    except (PartitionError, FileNotFoundError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc


def build(cfg: DictConfig, run_token: str) -> PersonalizedStrategy:
    info = DataSpec.from_dict(data_spec_dict(cfg)).info
    model_kwargs = {k: v for k, v in client_spec(cfg, run_token)["model"].items() if k != "name"}
    model = build_model(cfg.model.name, info.in_shape, info.num_classes, seed=int(cfg.seed), **model_kwargs)
    return build_strategy(
        cfg.method.name,
        model,
        client_spec(cfg, run_token),
        method_args=method_args(cfg),
        num_clients=int(cfg.num_clients),
        fraction=float(cfg.fraction),
        min_clients=int(cfg.min_clients),
        min_replies=int(cfg.min_replies),
        seed=int(cfg.seed),
        final_eval=bool(cfg.final_eval),
    )


def run_experiment(grid: Grid, cfg: DictConfig, check_partition: bool = True) -> dict[str, Any]:
    """Run ``cfg`` on ``grid``; returns the summary (also written to the run directory)."""
    if check_partition:
        check_data(cfg)
    run_dir = make_run_dir(cfg.output_dir, cfg.method.name, cfg.dataset.name)
    run_token = f"{run_dir.name}-{uuid.uuid4().hex[:8]}"
    strategy = build(cfg, run_token)
    writer = RunWriter(run_dir)
    writer.write_config(cfg)
    log(INFO, "pflower run directory: %s", run_dir)
    t0 = time.perf_counter()
    strategy.start(grid, num_rounds=int(cfg.rounds), timeout=float(cfg.round_timeout), on_round=writer.append_round)
    summary: dict[str, Any] = {
        "method": cfg.method.name,
        "dataset": cfg.dataset.name,
        "model": cfg.model.name,
        "partition": cfg.partition.name,
        "alpha": cfg.partition.get("alpha"),
        "num_clients": int(cfg.num_clients),
        **summarize(writer.rounds, int(cfg.headline_window)),
        **{k: v for k, v in strategy.final_metrics.items() if k != "dropped"},
        **strategy_summary(strategy),
        "wall_time_s": time.perf_counter() - t0,
        "run_dir": str(run_dir),
    }
    writer.write_summary(summary)
    writer.plot(f"{cfg.method.name} on {cfg.dataset.name}")
    for line in summary_table(summary).splitlines():
        log(INFO, "%s", line)
    return summary


def strategy_summary(strategy: PersonalizedStrategy) -> dict[str, Any]:
    """Method-specific values for the summary (e.g. FedCMD's selected layer)."""
    hook = getattr(strategy, "run_summary", None)
    return dict(hook()) if callable(hook) else {}


def summary_table(summary: dict[str, Any]) -> str:
    """The final summary as a small Markdown table (accuracies in percent)."""
    rows = ["", "| pflower summary | |", "|---|---|"]
    for key, value in summary.items():
        if isinstance(value, float):
            value = f"{100 * value:.2f}%" if "acc" in key else f"{value:.3f}"
        rows.append(f"| {key} | {value} |")
    return "\n".join(rows)
