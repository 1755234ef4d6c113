"""FedCPMD's client side (FedCPMD paper, client vote): FedCMD's layer scoring under FedCPMD's rule.

Phase 1: SGD on the whole model while every candidate layer is scored on each training batch
(the distance its options choose, labels fitted as y / (C - 1), sigma floored, ties to fc2);
the client's round vote is its most frequent batch vote. Phase 2: plain SGD; the runtime keeps
the client's own layer (the message's personal group). Phase 0: a vote-only probe for a client
that never voted (a no-grad pass over its training split with the model it received).
"""

from __future__ import annotations

from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.roles import FedCPMDArgs

from ..training import TrainArgs
from .base import FitPlan, RoleContext
from .fedcmd import FedCMDRole
from .layer_stats import LayerScorer, ScoreRule, score_pass


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
