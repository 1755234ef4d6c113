"""FedCMD's client side (fedcmd.md §2.2-2.4, §2.8): layer scoring and the per-round vote.

Phase 1: plain SGD on the whole model while every candidate layer ``l`` is scored with the
"feature distribution transfer" criterion (Eq. 6) and the client votes for the layer of
lowest score. Phase 2: plain SGD on all parameters (Alg. 1); which group stays personal is
handled by the runtime through the message's ``personal`` list.

The statistics are plain functions of tensors (no Flower) so they are unit-tested on
hand-built activations: a min-max normalised Gaussian fit of a tensor, the closed-form W2
of two 1-D Gaussians, the layer score and the vote rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from protocol.roles import GRANULARITIES, SCORE_MODES, W2_MODES, FedCMDArgs, check_choice

from ..data import ClientData
from ..training import LossFn, TrainArgs, train
from .base import Role, RoleContext


# ----------------------------------------------------------------------------- statistics
class GaussianFit(NamedTuple):
    """z(u) = Normal(mu, sigma^2) of the min-max normalised tensor (§2.2).

    ``constant`` marks a tensor whose max equals its min (e.g. a batch of one class):
    min-max normalisation is undefined there and every W2 term involving it is 0 [C].
    """

    mu: float
    sigma: float
    constant: bool = False


@dataclass(frozen=True)
class Moments:
    """Count, mean, sum of squared deviations, min and max of a tensor's elements.

    Mergeable (Chan et al.), so a fit over a whole local dataset is built batch by batch
    in one pass (``granularity="dataset"``) without keeping activations.
    """

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    lo: float = math.inf
    hi: float = -math.inf

    def merge(self, other: Moments) -> Moments:
        if other.n == 0:
            return self
        if self.n == 0:
            return other
        n = self.n + other.n
        delta = other.mean - self.mean
        mean = self.mean + delta * other.n / n
        m2 = self.m2 + other.m2 + delta * delta * self.n * other.n / n
        return Moments(n, mean, m2, min(self.lo, other.lo), max(self.hi, other.hi))


def tensor_moments(tensors: Sequence[torch.Tensor]) -> list[Moments]:
    """Moments of each tensor over all its elements, with a single device-to-host copy."""
    rows = []
    for t in tensors:
        u = t.detach().reshape(-1).to(torch.float64)
        mean = u.mean()
        rows.append(torch.stack([mean, ((u - mean) ** 2).sum(), u.min(), u.max()]))
    values = torch.stack(rows).cpu().tolist()
    return [Moments(t.numel(), *row) for t, row in zip(tensors, values)]


def gaussian_fit(m: Moments) -> GaussianFit:
    """Min-max normalise, then fit mean and std (unbiased, as torch.std in the official code [C]).

    Normalisation is affine, so mu = (mean - min) / range and sigma = std / range exactly:
    no normalised copy is materialised, and an affine rescaling of ``u`` leaves the fit
    unchanged (which is why min-max makes the score scale-free).
    """
    span = m.hi - m.lo
    if m.n < 1 or not math.isfinite(span) or span <= 0.0:
        return GaussianFit(0.0, 0.0, True)
    std = math.sqrt(max(m.m2, 0.0) / (m.n - 1)) if m.n > 1 else 0.0
    return GaussianFit((m.mean - m.lo) / span, std / span, False)


def fit_tensor(u: torch.Tensor) -> GaussianFit:
    """z(u) of one tensor (labels: pass them as they are; they are cast to float)."""
    return gaussian_fit(tensor_moments([u])[0])


def w2(a: GaussianFit, b: GaussianFit, mode: str = "gaussian") -> float:
    """Closed-form 2-Wasserstein distance of two 1-D Gaussians (§2.2).

    ``gaussian``: sqrt((mu_a - mu_b)^2 + (sigma_a - sigma_b)^2) (the paper's W2).
    ``mean_only``: |mu_a - mu_b| (what the official code computes). 0 if either side is a
    constant tensor (the code's NaN guard, §2.2 degenerate case).
    """
    if a.constant or b.constant:
        return 0.0
    if mode == "gaussian":
        return math.hypot(a.mu - b.mu, a.sigma - b.sigma)
    if mode == "mean_only":
        return abs(a.mu - b.mu)
    raise ValueError(f"w2_mode must be one of {W2_MODES}, got {mode!r}")


def layer_score(
    out: GaussianFit, prev: GaussianFit, x: GaussianFit, y: GaussianFit, score_mode: str = "paper", w2_mode: str = "gaussian"
) -> float:
    """s_l of a candidate with output fit ``out`` and previous-output fit ``prev`` (§2.3).

    paper (Eq. 6): | [W2(o_l,y) - W2(o_l,x)] - [W2(o_{l-1},y) - W2(o_{l-1},x)] |.
    code:          | |W2(o_l,y) - W2(o_{l-1},y)| - |W2(o_l,x) - W2(o_{l-1},x)| |.
    """
    oy, ox, py, px = (w2(a, b, w2_mode) for a, b in ((out, y), (out, x), (prev, y), (prev, x)))
    if score_mode == "paper":
        return abs((oy - ox) - (py - px))
    if score_mode == "code":
        return abs(abs(oy - py) - abs(ox - px))
    raise ValueError(f"score_mode must be one of {SCORE_MODES}, got {score_mode!r}")


def candidate_scores(
    fits: Mapping[int, GaussianFit] | Sequence[GaussianFit],
    x: GaussianFit,
    y: GaussianFit,
    candidate_index: Sequence[int],
    score_mode: str = "paper",
    w2_mode: str = "gaussian",
) -> list[float]:
    """s_l for each candidate, given the fits of every group output in forward order.

    ``candidate_index[c]`` is the group position of candidate c; its previous output is the
    preceding group's output (for fc1 of LeNet-5, the flattened conv2 block), or the input
    itself for the first group.
    """
    return [
        layer_score(fits[g], fits[g - 1] if g > 0 else x, x, y, score_mode, w2_mode) for g in candidate_index
    ]


def batch_vote(scores: Sequence[float]) -> int:
    """argmin over candidates; an exact tie goes to the earlier candidate (no fc2 prior, §2.3)."""
    return min(range(len(scores)), key=lambda c: (scores[c], c))


def client_vote(counts: Sequence[int], mean_scores: Sequence[float]) -> int:
    """The most frequent batch vote; ties: lower mean s_l, then earlier candidate (§2.4 [R])."""
    return min(range(len(counts)), key=lambda c: (-counts[c], mean_scores[c], c))


class LayerScorer:
    """Accumulates the scores of one client's batches and turns them into its vote.

    ``granularity="batch"``: every batch votes for its argmin; the client's vote is the
    most frequent one. ``"dataset"``: the moments of x, y and every needed group output
    are pooled over all observed batches and scored once (Alg. 2 line 2).
    """

    def __init__(
        self,
        group_names: Sequence[str],
        candidates: Sequence[str],
        score_mode: str = "paper",
        w2_mode: str = "gaussian",
        granularity: str = "batch",
    ) -> None:
        unknown = [c for c in candidates if c not in group_names]
        if not candidates or unknown:
            raise ValueError(f"FedCMD candidates {list(candidates)} must be groups of the model {list(group_names)}")
        _check("score_mode", score_mode, SCORE_MODES)
        _check("w2_mode", w2_mode, W2_MODES)
        _check("granularity", granularity, GRANULARITIES)
        self.candidates = list(candidates)
        self.index = [list(group_names).index(c) for c in candidates]
        # group outputs the scores need: each candidate and the one before it
        self.needed = sorted({g for i in self.index for g in (i, i - 1) if g >= 0})
        self.score_mode, self.w2_mode, self.granularity = score_mode, w2_mode, granularity
        self.counts = [0] * len(candidates)
        self.score_sums = [0.0] * len(candidates)
        self.batches = 0
        self.pooled: list[Moments] = [Moments()] * (2 + len(self.needed))  # x, y, needed outputs

    def observe(self, x: torch.Tensor, y: torch.Tensor, outputs: Sequence[torch.Tensor]) -> None:
        """Record one batch: its input, labels and the outputs of every group (forward order)."""
        moments = tensor_moments([x, y, *(outputs[g] for g in self.needed)])
        self.batches += 1
        if self.granularity == "dataset":
            self.pooled = [a.merge(b) for a, b in zip(self.pooled, moments)]
            return
        scores = self._scores(moments)
        self.counts[batch_vote(scores)] += 1
        self.score_sums = [s + t for s, t in zip(self.score_sums, scores)]

    def _scores(self, moments: Sequence[Moments]) -> list[float]:
        fx, fy, *outs = (gaussian_fit(m) for m in moments)
        fits: dict[int, GaussianFit] = dict(zip(self.needed, outs))
        return candidate_scores(fits, fx, fy, self.index, self.score_mode, self.w2_mode)

    def metrics(self) -> dict[str, float]:
        """``vote`` (candidate index, -1 if nothing was scored), ``votes_<l>``, ``s_mean_<l>``."""
        if self.batches == 0:
            return {"vote": -1.0, "scored_batches": 0.0}
        if self.granularity == "dataset":
            means = self._scores(self.pooled)
            counts = [0] * len(self.candidates)
            counts[batch_vote(means)] = 1
        else:
            counts, means = self.counts, [s / self.batches for s in self.score_sums]
        out: dict[str, float] = {"vote": float(client_vote(counts, means)), "scored_batches": float(self.batches)}
        for c, name in enumerate(self.candidates):
            out[f"votes_{name}"] = float(counts[c])
            out[f"s_mean_{name}"] = float(means[c])
        return out


def _check(option: str, value: str, allowed: tuple[str, ...]) -> None:
    check_choice("FedCMD", option, value, allowed)


@torch.no_grad()
def score_pass(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, scorer: LayerScorer, batch_size: int, device: torch.device
) -> None:
    """One no-grad pass in eval mode over (x, y), scoring every batch (Alg. 2 lines 8-11)."""
    was_training = model.training
    model.eval()
    for start in range(0, len(y), batch_size):
        xb, yb = x[start : start + batch_size].to(device), y[start : start + batch_size].to(device)
        scorer.observe(xb, yb, model.forward_groups(xb))
    model.train(was_training)


# ----------------------------------------------------------------------------- the role
class FedCMDRole(Role):
    """Phase 1: SGD + layer votes; phase 2: SGD on all parameters (the runtime keeps l* local).

    role_args: ``phase`` (1|2); phase 1 also ``candidates``, ``score_mode``, ``w2_mode``,
    ``selection_timing`` and ``granularity``.
    """

    name = "fedcmd"
    args_type = FedCMDArgs

    def fit(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict[str, float]:
        if self.args.phase != 1:
            return {"train_loss": train(model, data.x_train, data.y_train, train_args, generator=ctx.generator, device=ctx.device)}
        timing = self.args.selection_timing
        scorer = LayerScorer(
            model.group_names,
            list(self.args.candidates),
            score_mode=self.args.score_mode,
            w2_mode=self.args.w2_mode,
            granularity=self.args.granularity,
        )
        if timing == "during_training":
            loss = train(
                model, data.x_train, data.y_train, train_args,
                loss_fn=_scoring_loss(scorer), generator=ctx.generator, device=ctx.device,
            )
        else:
            loss = train(model, data.x_train, data.y_train, train_args, generator=ctx.generator, device=ctx.device)
            score_pass(model, data.x_train, data.y_train, scorer, train_args.batch_size, ctx.device)
        return {"train_loss": loss, **scorer.metrics()}


def _scoring_loss(scorer: LayerScorer) -> LossFn:
    """Cross-entropy that also scores the batch from the same forward pass (activations detached)."""

    def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        outputs = model.forward_groups(x)
        scorer.observe(x, y, [o.detach() for o in outputs])
        return nn.functional.cross_entropy(outputs[-1], y)

    return loss_fn
