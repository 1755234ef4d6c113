"""FedCMD's client side (FedCMD paper, algorithm): layer scoring and the per-round vote.

Phase 1: plain SGD on the whole model while every candidate layer ``l`` is scored with the
"feature distribution transfer" criterion (Eq. 6) and the client votes for the layer of
lowest score. Phase 2: plain SGD on all parameters (Alg. 1); which group stays personal is
handled by the runtime through the message's ``personal`` list. The statistics themselves
(Gaussian fits, distances, scores, votes, the scorer) are plain functions in ``layer_stats.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option, sent
from pflower.protocol.role_args import RoleArgs, RoleArgsError

from ..training import LossFn, TrainArgs
from .base import FitPlan, Role, RoleContext, train_own
from .layer_stats import GRANULARITIES, SCORE_MODES, SELECTION_TIMINGS, W2_MODES, LayerScorer, ScoreRule, score_pass

CANDIDATES_DOC = (
    "groups that may become the personal layer (null: the FC groups, from the first fc* or classifier group on; "
    "LeNet-5: fc1, fc2, classifier)"
)


def check_votes(phase: int, voting: tuple[int, ...], candidates: list[str] | None, tie_prior: str | None) -> None:
    """A voting phase needs candidate layers, and a tie prior among them."""
    if phase in voting and not candidates:
        raise RoleArgsError(f"phase {phase} votes for a layer: it needs candidate layers", "candidates")
    if phase in voting and tie_prior is not None and tie_prior not in (candidates or []):
        raise RoleArgsError(f"tie_prior={tie_prior!r} is not a candidate {candidates}", "tie_prior")


@dataclass(frozen=True)
class FedCMDArgs(RoleArgs):
    """FedCMD's client (FedCMD paper, algorithm): phase 1 scores the candidate layers and votes,
    phase 2 is SGD with l* kept local."""

    candidates: list[str] | None = option(None, CANDIDATES_DOC)
    score_mode: str = option("paper", "layer score: paper (Eq. 5/6) or code (the authors' code)", choices=SCORE_MODES)
    w2_mode: str = option("gaussian", "Wasserstein distance of 1-D Gaussians, or of their means only", choices=W2_MODES)
    selection_timing: str = option("during_training", "when the statistics are read", choices=SELECTION_TIMINGS)
    granularity: str = option("batch", "statistics per batch or over the whole split", choices=GRANULARITIES)
    tie_prior: str | None = option(
        None,
        "the candidate an exact tie at a batch's minimum score goes to (the authors' code: fc2; null: the earlier)",
    )
    phase: int = sent(2, "1: score the candidates and vote; 2: train (l* stays on the client)", choices=(1, 2))
    personal_layer: str | None = sent(None, "phase 2: l*")
    has_phi_init: bool = sent(False, "phase 2: the message carries l*'s initial value")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_votes(self.phase, (1,), self.candidates, self.tie_prior)


# ----------------------------------------------------------------------------- the role
class FedCMDRole(Role):
    """Phase 1: SGD + layer votes; phase 2: SGD on all parameters (the runtime keeps l* local)."""

    name = "fedcmd"
    args_type = FedCMDArgs

    def plan(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> FitPlan | None:
        """Phase 2: plain SGD; phase 1 scored after training: SGD, then the scoring pass; phase 1
        scored on the training batches themselves is not a plan (:meth:`fit_alone`)."""
        if self.args.phase != 1:
            return FitPlan()
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
