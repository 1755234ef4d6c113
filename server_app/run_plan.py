"""A run's config resolved once into the typed pieces the runner's steps read.

The composed config (a hydra ``DictConfig``) is resolved here a single time per run: the data
specification every client is sent and the server partitions, the architectures and who runs
which, and the method's options. The runner passes this object from step to step instead of
re-deriving each piece from the raw config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from pflower.federated_data import DataSpec

from .config import MIXED, data_spec_dict, method_args, model_archs, model_entries, model_spec


@dataclass(frozen=True)
class RunPlan:
    cfg: DictConfig  # the composed config, for the keys read once (rounds, timeouts, output)
    data_fields: dict[str, Any]  # the DataSpec fields as every client receives them
    data: DataSpec
    archs: dict[str, dict[str, Any]]  # architecture name -> model spec (one for a homogeneous run)
    assign: Any  # who runs which architecture (a mixed federation's rule)
    mixed: bool
    method: str
    options: dict[str, Any]  # the method's options (conf/method/<name>.yaml, overridden)

    @classmethod
    def of(cls, cfg: DictConfig | RunPlan) -> RunPlan:
        """The plan of ``cfg`` (a plan is returned as it is)."""
        if isinstance(cfg, RunPlan):
            return cfg
        fields = data_spec_dict(cfg)
        archs, assign = model_archs(cfg)
        return cls(
            cfg=cfg,
            data_fields=fields,
            data=DataSpec.from_dict(fields),
            archs=archs,
            assign=assign,
            mixed=model_spec(cfg).get("name") == MIXED,
            method=str(cfg.method.name),
            options=method_args(cfg),
        )

    def model_entries(self) -> dict[str, Any]:
        """The client spec's model keys (:func:`server_app.config.model_entries`, from the resolved architectures)."""
        return model_entries(self.cfg, (self.archs, self.assign))
