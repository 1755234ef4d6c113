"""A run's config resolved once into the typed pieces the runner's steps read.

:func:`plan_run` is the one way from overrides to a run: ``pflower sim`` (each run of a sweep),
``pflower run``'s pre-check, the ServerApp of `flwr run`, the leaderboard and the benchmarks call
it. It composes conf/ with the overrides (hydra; a resume takes the run's saved config.yaml),
validates the result and resolves it a single time into this plan: the run's own settings
(rounds, clients, timeouts, output), the engine's, the data specification every client is sent
and the server partitions, the architectures and who runs which, and the method's options. The
runner, the engines and the ServerApp take the plan; nothing after this reads the composed
config: the plan keeps only its YAML text (``record``), the run's ``config.yaml`` and what a
resume compares with the saved one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pflower.federated_data import DataSpec
from pflower.strategies.base.client_spec import for_run

from .config import (
    MIXED,
    client_spec_fields,
    compose_config,
    data_spec_dict,
    method_args,
    model_archs,
    model_entries,
    model_spec,
)


def plan_run(overrides: Sequence[str] = ()) -> RunPlan:
    """The validated plan of one run from its overrides (``method=fedper``, ``rounds=30``,
    ``resume=<run dir>``...): the only function that turns overrides into a run; a bad key or value
    is a :class:`server_app.config.ConfigError` naming it and the fix."""
    return RunPlan.of(compose_config(list(overrides)))


@dataclass(frozen=True)
class RunSettings:
    """The run's own keys (conf/config.yaml's top level), typed."""

    num_clients: int
    rounds: int
    fraction: float
    min_clients: int
    min_replies: int
    seed: int
    final_eval: bool
    round_timeout: float  # seconds a round waits for its replies
    checkpoint_every: int  # 0: no checkpoints
    headline_window: int  # rounds averaged into the headline accuracy
    progress: bool
    output_dir: str
    resume: str | None
    resume_force: bool
    client_state_dir: str | None
    dataset: str  # names, for the run's record
    model: str
    partition: str
    alpha: Any  # the partition's alpha as configured (None where it has none)

    @classmethod
    def of(cls, cfg: DictConfig) -> RunSettings:
        return cls(
            num_clients=int(cfg.num_clients),
            rounds=int(cfg.rounds),
            fraction=float(cfg.fraction),
            min_clients=int(cfg.min_clients),
            min_replies=int(cfg.min_replies),
            seed=int(cfg.seed),
            final_eval=bool(cfg.final_eval),
            round_timeout=float(cfg.round_timeout),
            checkpoint_every=int(cfg.get("checkpoint_every", 1)),
            headline_window=int(cfg.headline_window),
            progress=bool(cfg.get("progress", True)),
            output_dir=str(cfg.output_dir),
            resume=str(cfg.resume) if cfg.get("resume") else None,
            resume_force=bool(cfg.get("resume_force", False)),
            client_state_dir=None if cfg.get("client_state_dir") is None else str(cfg.client_state_dir),
            dataset=str(cfg.dataset.name),
            model=str(cfg.model.name),
            partition=str(cfg.partition.name),
            alpha=cfg.partition.get("alpha"),
        )


@dataclass(frozen=True)
class EngineSettings:
    """How ``pflower sim`` runs the clients (``backend`` and its keys); the ServerApp of a real
    federation ignores them."""

    backend: str  # ray | serial | parallel | batched
    workers: Any  # "auto" or a count (server_app.config.resolve_workers)
    batch_clients: int
    device: str
    ray_client_cpus: float
    ray_client_gpus: Any  # "auto" or a share
    ray_address: str | None

    @classmethod
    def of(cls, cfg: DictConfig) -> EngineSettings:
        ray = cfg.get("ray") or {}
        address = ray.get("address")
        return cls(
            backend=str(cfg.get("backend", "ray")),
            workers=cfg.get("workers", "auto"),
            batch_clients=int(cfg.get("batch_clients", 64)),
            device=str(cfg.get("device", "auto")),
            ray_client_cpus=float(ray.get("client_cpus", 1)),
            ray_client_gpus=ray.get("client_gpus", "auto"),
            ray_address=str(address) if address else None,
        )

    @property
    def in_process(self) -> bool:
        """Every client in this process or its forked workers (no Ray)."""
        return self.backend in ("serial", "parallel", "batched")


@dataclass(frozen=True)
class RunPlan:
    record: str  # the composed config as YAML: the run's config.yaml, and what a resume compares with it
    run: RunSettings
    engine: EngineSettings
    data_fields: dict[str, Any]  # the DataSpec fields as every client receives them
    data: DataSpec
    archs: dict[str, dict[str, Any]]  # architecture name -> model spec (one for a homogeneous run)
    assign: Any  # who runs which architecture (a mixed federation's rule)
    mixed: bool
    method: str
    options: dict[str, Any]  # the method's options (its options dataclass's defaults, overridden)
    client_fields: dict[str, Any]  # the client spec but the run's token and folders (config.client_spec_fields)

    @classmethod
    def of(cls, cfg: DictConfig) -> RunPlan:
        """The plan of a composed, validated config (:func:`plan_run` composes and calls this)."""
        fields = data_spec_dict(cfg)
        archs, assign = model_archs(cfg)
        models = model_entries(cfg, (archs, assign))
        return cls(
            record=OmegaConf.to_yaml(cfg),
            run=RunSettings.of(cfg),
            engine=EngineSettings.of(cfg),
            data_fields=fields,
            data=DataSpec.from_dict(fields),
            archs=archs,
            assign=assign,
            mixed=model_spec(cfg).get("name") == MIXED,
            method=str(cfg.method.name),
            options=method_args(cfg),
            client_fields=client_spec_fields(cfg, data=fields, models=models),
        )

    def client_spec(self, run_token: str, client_state_dir: str | None, server_store_dir: str | None) -> dict[str, Any]:
        """Everything a client is sent: the fields resolved with the plan and the run's token and
        folders (no second reading of the config)."""
        return for_run(self.client_fields, run_token, client_state_dir, server_store_dir)
