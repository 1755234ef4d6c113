"""FedCPMD's client side (FedCPMD paper, client vote): FedCMD's layer scoring under FedCPMD's rule.

Phase 1: SGD on the whole model while every candidate layer is scored on each training batch
(the distance its options choose, labels fitted as y / (C - 1), sigma floored, ties to fc2);
the client's round vote is its most frequent batch vote. Phase 2: plain SGD; the runtime keeps
the client's own layer (the message's personal group). Phase 0: a vote-only probe for a client
that never voted (a no-grad pass over its training split with the model it received).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option, sent
from pflower.protocol.role_args import RoleArgs

from ..training import TrainArgs
from .base import FitPlan, RoleContext
from .fedcmd import CANDIDATES_DOC, FedCMDRole, check_votes
from .layer_stats import (
    DISTANCES,
    GRANULARITIES,
    LABEL_FITS,
    SELECTION_TIMINGS,
    SELECTORS,
    LayerScorer,
    ScoreRule,
    score_pass,
)


@dataclass(frozen=True)
class FedCPMDArgs(RoleArgs):
    """FedCPMD's client (FedCPMD paper, algorithm): ``phase`` 1 trains and votes for a candidate
    layer, 2 trains, 0 is a vote-only probe (a no-grad scoring pass over the training split, no
    update). The score: ``distance`` between 1-D Gaussian fits, ``selector``, labels fitted by
    ``label_fit``, sigma floored, exact ties at the minimum to ``tie_prior``."""

    candidates: list[str] | None = option(
        None, CANDIDATES_DOC.replace("the personal layer", "a client's personal layer")
    )
    distance: str = option("js", "distance between two 1-D Gaussians", choices=DISTANCES)
    selector: str = option("eq7", "the layer score", choices=SELECTORS)
    label_fit: str = option("scaled", "z^y: y / (C - 1) (scaled) or per-batch min-max", choices=LABEL_FITS)
    sigma_floor: float = option(1e-3, "smallest standard deviation of a fitted Gaussian", above=0)
    tie_prior: str | None = option("fc2", "the group a tied vote goes to (null: forward order)")
    granularity: str = option("batch", "statistics per batch or over the whole split", choices=GRANULARITIES)
    selection_timing: str = option("during_training", "when the statistics are read", choices=SELECTION_TIMINGS)
    phase: int = sent(2, "0: a vote-only probe; 1: train and vote; 2: train", choices=(0, 1, 2))

    def __post_init__(self) -> None:
        super().__post_init__()
        check_votes(self.phase, (0, 1), self.candidates, None)


class FedCPMDRole(FedCMDRole):
    name = "fedcpmd"
    args_type = FedCPMDArgs

    def plan(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> FitPlan | None:
        """Phase 0 (a probe, no training) is not a plan; phases 1 and 2 as FedCMD's."""
        if self.args.phase == 0:
            return None
        return super().plan(model, data, train_args, ctx)

    def trains(self, model: nn.Module, ctx: RoleContext) -> bool:
        """Phase 0 is a vote-only probe: no training."""
        return self.args.phase != 0

    def fit_alone(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict:
        if self.args.phase == 0:
            scorer = self.scorer(model, data)
            score_pass(model, data.x_train, data.y_train, scorer, train_args.batch_size, ctx.device)
            return {"train_loss": 0.0, "probe": 1.0, **scorer.metrics()}
        return super().fit_alone(model, data, train_args, ctx)

    def scorer(self, model: nn.Module, data: ClientData) -> LayerScorer:
        a = self.args
        rule = ScoreRule(a.selector, a.distance, a.label_fit, a.sigma_floor, a.tie_prior, data.num_classes)
        return LayerScorer(model.group_names, list(a.candidates), granularity=a.granularity, rule=rule)
