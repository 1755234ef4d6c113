"""FedCMD's client side (FedCMD paper, algorithm): layer scoring and the per-round vote.

Phase 1: plain SGD on the whole model while every candidate layer ``l`` is scored with the
"feature distribution transfer" criterion (Eq. 6) and the client votes for the layer of
lowest score. Phase 2: plain SGD on all parameters (Alg. 1); which group stays personal is
handled by the runtime through the message's ``personal`` list. The statistics themselves
(Gaussian fits, distances, scores, votes, the scorer) are plain functions in ``layer_stats.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.roles import SELECTION_TIMINGS, FedCMDArgs

from ..training import LossFn, TrainArgs
from .base import FitPlan, Role, RoleContext, train_own
from .layer_stats import LayerScorer, ScoreRule, check_option, score_pass


# ----------------------------------------------------------------------------- the role
class FedCMDRole(Role):
    """Phase 1: SGD + layer votes; phase 2: SGD on all parameters (the runtime keeps l* local).

    role_args: ``phase`` (1|2); phase 1 also ``candidates``, ``score_mode``, ``w2_mode``,
    ``selection_timing`` and ``granularity``.
    """

    name = "fedcmd"
    args_type = FedCMDArgs

    def plan(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> FitPlan | None:
        """Phase 2: plain SGD; phase 1 scored after training: SGD, then the scoring pass; phase 1
        scored on the training batches themselves is not a plan (:meth:`fit_alone`)."""
        if self.args.phase != 1:
            return FitPlan()
        check_option("selection_timing", self.args.selection_timing, SELECTION_TIMINGS)
        if self.args.selection_timing != "after_training":
            return None
        scorer = self.scorer(model, data)

        def vote(trained: nn.Module) -> dict[str, float]:
            score_pass(trained, data.x_train, data.y_train, scorer, train_args.batch_size, ctx.device)
            return scorer.metrics()

        return FitPlan(after=vote)

    def fit_alone(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict:
        return train_and_vote(model, data, train_args, ctx, self.scorer(model, data))

    def scorer(self, model: nn.Module, data: ClientData) -> LayerScorer:
        """This client's layer scorer (FedCMD's rule: W2, min-max labels, no floor; ties to ``tie_prior``)."""
        return LayerScorer(
            model.group_names,
            list(self.args.candidates),
            granularity=self.args.granularity,
            rule=ScoreRule.fedcmd(self.args.score_mode, self.args.w2_mode, self.args.tie_prior),
        )


def train_and_vote(
    model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext, scorer: LayerScorer
) -> dict[str, float]:
    """Local training that also scores the candidate layers on the training batches' own forward
    passes (``selection_timing=during_training``); returns the loss and the vote."""
    loss = train_own(model, data, train_args, ctx, _scoring_loss(scorer))
    return {"train_loss": loss, **scorer.metrics()}


def _scoring_loss(scorer: LayerScorer) -> LossFn:
    """Cross-entropy that also scores the batch from the same forward pass (activations detached)."""

    def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        outputs = model.forward_groups(x)
        scorer.observe(x, y, [o.detach() for o in outputs])
        return nn.functional.cross_entropy(outputs[-1], y)

    return loss_fn
