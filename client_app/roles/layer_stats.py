"""Layer statistics a client computes for FedCMD and FedCPMD: plain functions of tensors (no
Flower), unit-tested on hand-built activations.

A min-max normalised Gaussian fit of a tensor, the distances between two 1-D Gaussians (W2 in
closed form, FedCMD paper Eq. 6; Jensen-Shannon, Hellinger and Bhattacharyya, FedCPMD paper,
layer-wise knowledge representation, Eqs. 6-11), the layer score and the vote rules, and the
:class:`LayerScorer` that accumulates one client's batches into its vote under a
:class:`ScoreRule` (FedCMD's defaults, or FedCPMD's: label fit, sigma floor, tie prior).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from pflower.protocol.role_args import RoleArgsError

# the choices of FedCMD's and FedCPMD's scoring options (declared in their role arguments)
SCORE_MODES = ("paper", "code")  # FedCMD layer score (FedCMD paper, layer score (Eq. 5/6))
W2_MODES = ("gaussian", "mean_only")
SELECTION_TIMINGS = ("during_training", "after_training")
GRANULARITIES = ("batch", "dataset")
# FedCPMD's layer score (FedCPMD paper, layer-wise knowledge representation (Eqs. 6-11))
SELECTORS = ("eq7", "fedcmd_code", "eq6")
DISTANCES = ("js", "w2", "hellinger", "bhattacharyya", "w2_mean")  # d between two 1-D Gaussians
LABEL_FITS = ("minmax", "scaled")  # z^y: per-batch min-max (FedCMD) or y / (C - 1) (FedCPMD)

_SELECTOR_ALIASES = {"paper": "eq7", "code": "fedcmd_code", "eq7": "eq7", "fedcmd_code": "fedcmd_code", "eq6": "eq6"}
_DISTANCE_ALIASES = {"gaussian": "w2", "mean_only": "w2_mean"}


# ----------------------------------------------------------------------------- statistics
class GaussianFit(NamedTuple):
    """z(u) = Normal(mu, sigma^2) of the min-max normalised tensor (FedCMD paper).

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


def moment_rows(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """[len(tensors), 4] float64 rows (mean, sum of squared deviations, min, max), left on the
    tensors' device: a scorer keeps a round's rows there and copies them to the host once."""
    rows = []
    for t in tensors:
        u = t.detach().reshape(-1).to(torch.float64)
        mean = u.mean()
        rows.append(torch.stack([mean, ((u - mean) ** 2).sum(), u.min(), u.max()]))
    return torch.stack(rows)


def tensor_moments(tensors: Sequence[torch.Tensor]) -> list[Moments]:
    """Moments of each tensor over all its elements, with a single device-to-host copy."""
    values = moment_rows(tensors).cpu().tolist()
    return [Moments(t.numel(), *row) for t, row in zip(tensors, values)]


def gaussian_fit(m: Moments, sigma_floor: float = 0.0) -> GaussianFit:
    """Min-max normalise, then fit mean and std (unbiased, as torch.std in the official code [C]).

    Normalisation is affine, so mu = (mean - min) / range and sigma = std / range exactly:
    no normalised copy is materialised, and an affine rescaling of ``u`` leaves the fit
    unchanged (which is why min-max makes the score scale-free).

    A constant tensor (max = min): with ``sigma_floor = 0`` (FedCMD) it is marked ``constant``
    and every distance to it is 0 [C]; with a floor (FedCPMD, FedCPMD paper, layer-wise knowledge representation (Eqs.
    6-11): "set the values
    to 0") it is N(0, floor^2). The floor also bounds sigma from below for every other tensor.
    """
    span = m.hi - m.lo
    if m.n < 1 or not math.isfinite(span) or span <= 0.0:
        return GaussianFit(0.0, sigma_floor, False) if sigma_floor > 0 else GaussianFit(0.0, 0.0, True)
    std = math.sqrt(max(m.m2, 0.0) / (m.n - 1)) if m.n > 1 else 0.0
    return GaussianFit((m.mean - m.lo) / span, max(std / span, sigma_floor), False)


def label_fit(m: Moments, mode: str = "minmax", num_classes: int = 2, sigma_floor: float = 0.0) -> GaussianFit:
    """z^y of a batch's labels. ``minmax``: like any tensor (FedCMD; a one-class batch is
    constant). ``scaled``: (mean, std) of y / (C - 1) with no per-batch min-max, std floored
    (the FedCPMD paper's reading: the official code's per-batch min-max makes one-class batches NaN)."""
    if mode == "minmax":
        return gaussian_fit(m, sigma_floor)
    if mode != "scaled":
        raise ValueError(f"label_fit must be one of {list(LABEL_FITS)}, got {mode!r}")
    scale = max(num_classes - 1, 1)
    std = math.sqrt(max(m.m2, 0.0) / (m.n - 1)) if m.n > 1 else 0.0
    return GaussianFit(m.mean / scale, max(std / scale, sigma_floor), False)


def fit_tensor(u: torch.Tensor) -> GaussianFit:
    """z(u) of one tensor (labels: pass them as they are; they are cast to float)."""
    return gaussian_fit(tensor_moments([u])[0])


def w2(a: GaussianFit, b: GaussianFit, mode: str = "gaussian") -> float:
    """Closed-form 2-Wasserstein distance of two 1-D Gaussians (FedCMD paper).

    ``gaussian``: sqrt((mu_a - mu_b)^2 + (sigma_a - sigma_b)^2) (the paper's W2).
    ``mean_only``: |mu_a - mu_b| (what the official code computes). 0 if either side is a
    constant tensor (the code's NaN guard for that degenerate case).
    """
    if a.constant or b.constant:
        return 0.0
    if mode == "gaussian":
        return math.hypot(a.mu - b.mu, a.sigma - b.sigma)
    if mode == "mean_only":
        return abs(a.mu - b.mu)
    raise ValueError(f"w2_mode must be one of {W2_MODES}, got {mode!r}")


def bhattacharyya_coefficient(a: GaussianFit, b: GaussianFit) -> float:
    """BC = sqrt(2 s1 s2 / (s1^2 + s2^2)) exp(-(m1 - m2)^2 / (4 (s1^2 + s2^2))) (FedCPMD paper, layer-wise knowledge
    representation (Eqs. 6-11))."""
    var = a.sigma**2 + b.sigma**2
    if var <= 0.0:
        return 1.0 if a.mu == b.mu else 0.0
    return math.sqrt(2.0 * a.sigma * b.sigma / var) * math.exp(-((a.mu - b.mu) ** 2) / (4.0 * var))


JS_POINTS = 2001  # FedCPMD paper, layer-wise knowledge representation (Eqs. 6-11): trapezoid rule on 2001 points


def jensen_shannon(a: GaussianFit, b: GaussianFit, points: int = JS_POINTS) -> float:
    """JS(P, Q) = KL(P||M)/2 + KL(Q||M)/2, M = (P + Q)/2, natural log, in [0, ln 2]: no closed form,
    so the trapezoid rule on [min mu - 8 max sigma, max mu + 8 max sigma] (FedCPMD paper, layer-wise knowledge
    representation (Eqs. 6-11))."""
    if a.sigma <= 0.0 or b.sigma <= 0.0:
        return 0.0 if (a.mu, a.sigma) == (b.mu, b.sigma) else math.log(2.0)
    spread = 8.0 * max(a.sigma, b.sigma)
    grid = np.linspace(min(a.mu, b.mu) - spread, max(a.mu, b.mu) + spread, points)
    p = np.exp(-0.5 * ((grid - a.mu) / a.sigma) ** 2) / (a.sigma * math.sqrt(2 * math.pi))
    q = np.exp(-0.5 * ((grid - b.mu) / b.sigma) ** 2) / (b.sigma * math.sqrt(2 * math.pi))
    m = 0.5 * (p + q)
    with np.errstate(divide="ignore", invalid="ignore"):
        integrand = 0.5 * np.where(p > 0, p * np.log(p / m), 0.0) + 0.5 * np.where(q > 0, q * np.log(q / m), 0.0)
    return float(min(max(np.trapezoid(integrand, grid), 0.0), math.log(2.0)))


def distance(a: GaussianFit, b: GaussianFit, name: str = "w2") -> float:
    """d(P, Q) between two 1-D Gaussian fits: ``w2`` (alias ``gaussian``), ``w2_mean`` (alias
    ``mean_only``), ``js``, ``hellinger`` (sqrt(1 - BC), in [0, 1]) or ``bhattacharyya`` (-ln BC).
    Every distance to a ``constant`` fit is 0 (FedCMD's NaN guard; FedCPMD floors sigma instead)."""
    name = _DISTANCE_ALIASES.get(name, name)
    if name == "w2":
        return w2(a, b, "gaussian")
    if name == "w2_mean":
        return w2(a, b, "mean_only")
    if a.constant or b.constant:
        return 0.0
    if name == "js":
        return jensen_shannon(a, b)
    if name == "hellinger":
        return math.sqrt(max(1.0 - bhattacharyya_coefficient(a, b), 0.0))
    if name == "bhattacharyya":
        return -math.log(max(bhattacharyya_coefficient(a, b), 1e-300))
    raise ValueError(f"distance must be one of {list(DISTANCES)}, got {name!r}")


def layer_score(
    out: GaussianFit,
    prev: GaussianFit,
    x: GaussianFit,
    y: GaussianFit,
    score_mode: str = "paper",
    w2_mode: str = "gaussian",
) -> float:
    """s_l of a candidate with output fit ``out`` and previous-output fit ``prev`` (FedCMD paper).

    ``score_mode`` (the selector; FedCPMD names them ``eq7``, ``fedcmd_code``, ``eq6``) and
    ``w2_mode`` (the distance d, :func:`distance`; FedCMD's ``gaussian``/``mean_only`` are W2's):
    paper / eq7 (FedCMD Eq. 6, FedCPMD Eq. 7): | [d(o_l,y) - d(o_l,x)] - [d(o_{l-1},y) - d(o_{l-1},x)] |.
    code / fedcmd_code: | |d(o_l,y) - d(o_{l-1},y)| - |d(o_l,x) - d(o_{l-1},x)| |.
    eq6 (FedCPMD's reference code): d(N(mu_l - mu_{l-1}, s_l^2 + s_{l-1}^2), N(mu_y - mu_x, s_y^2 + s_x^2)).
    """
    selector = _SELECTOR_ALIASES.get(score_mode, score_mode)
    if selector == "eq6":
        if out.constant or prev.constant or x.constant or y.constant:
            return 0.0
        layer = GaussianFit(out.mu - prev.mu, math.hypot(out.sigma, prev.sigma))
        data = GaussianFit(y.mu - x.mu, math.hypot(y.sigma, x.sigma))
        return distance(layer, data, w2_mode)
    oy, ox, py, px = (distance(a, b, w2_mode) for a, b in ((out, y), (out, x), (prev, y), (prev, x)))
    if selector == "eq7":
        return abs((oy - ox) - (py - px))
    if selector == "fedcmd_code":
        return abs(abs(oy - py) - abs(ox - px))
    raise ValueError(
        f"score_mode must be one of {SCORE_MODES} (FedCPMD selector: {list(SELECTORS)}), got {score_mode!r}"
    )


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
    return [layer_score(fits[g], fits[g - 1] if g > 0 else x, x, y, score_mode, w2_mode) for g in candidate_index]


def batch_vote(scores: Sequence[float], prior: int | None = None) -> int:
    """argmin over candidates. An exact tie at the minimum goes to ``prior`` if it is among the
    tied (FedCPMD: fc2, its reference code's preference), else to the earlier candidate (FedCMD:
    no prior)."""
    best = min(scores)
    if prior is not None and 0 <= prior < len(scores) and scores[prior] == best:
        return prior
    return min(range(len(scores)), key=lambda c: (scores[c], c))


def client_vote(counts: Sequence[int], mean_scores: Sequence[float]) -> int:
    """The most frequent batch vote; ties: lower mean s_l, then earlier candidate (FedCMD paper)."""
    return min(range(len(counts)), key=lambda c: (-counts[c], mean_scores[c], c))


@dataclass(frozen=True)
class ScoreRule:
    """How a client scores its candidate layers: FedCMD's defaults, or FedCPMD's (FedCPMD paper, algorithm)."""

    selector: str = "eq7"  # eq7 (paper) | fedcmd_code (code) | eq6
    distance: str = "w2"  # w2 | w2_mean | js | hellinger | bhattacharyya
    label_fit: str = "minmax"  # minmax (FedCMD) | scaled (y / (C - 1), FedCPMD)
    sigma_floor: float = 0.0  # FedCPMD: 1e-3
    tie_prior: str | None = None  # a candidate preferred on exact ties at the minimum (FedCPMD: fc2)
    num_classes: int = 2  # C, for label_fit="scaled"

    @classmethod
    def fedcmd(cls, score_mode: str = "paper", w2_mode: str = "gaussian", tie_prior: str | None = None) -> ScoreRule:
        check_option("score_mode", score_mode, SCORE_MODES)
        check_option("w2_mode", w2_mode, W2_MODES)
        return cls(selector=_SELECTOR_ALIASES[score_mode], distance=_DISTANCE_ALIASES[w2_mode], tie_prior=tie_prior)


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
        rule: ScoreRule | None = None,
    ) -> None:
        unknown = [c for c in candidates if c not in group_names]
        if not candidates or unknown:
            raise ValueError(f"candidate layers {list(candidates)} must be groups of the model {list(group_names)}")
        check_option("granularity", granularity, GRANULARITIES)
        self.rule = rule if rule is not None else ScoreRule.fedcmd(score_mode, w2_mode)
        self.candidates = list(candidates)
        self.index = [list(group_names).index(c) for c in candidates]
        self.prior = self.candidates.index(self.rule.tie_prior) if self.rule.tie_prior in self.candidates else None
        # group outputs the scores need: each candidate and the one before it
        self.needed = sorted({g for i in self.index for g in (i, i - 1) if g >= 0})
        self.granularity = granularity
        self.counts = [0] * len(candidates)
        self.score_sums = [0.0] * len(candidates)
        self.batches = 0
        self.pooled: list[Moments] = [Moments()] * (2 + len(self.needed))  # x, y, needed outputs
        self.pending: list[tuple[torch.Tensor, list[int]]] = []  # observed batches not yet scored

    def observe(self, x: torch.Tensor, y: torch.Tensor, outputs: Sequence[torch.Tensor]) -> None:
        """Record one batch: its input, labels and the outputs of every group (forward order).
        Its moments stay on the device; they are scored, in order, when the metrics are read."""
        tensors = [x, y, *(outputs[g] for g in self.needed)]
        self.pending.append((moment_rows(tensors), [t.numel() for t in tensors]))
        self.batches += 1

    def _score_pending(self) -> None:
        """Score the observed batches in the order they came, after one device-to-host copy."""
        if not self.pending:
            return
        values = torch.stack([rows for rows, _ in self.pending]).cpu().tolist()
        for batch_rows, (_, numels) in zip(values, self.pending):
            moments = [Moments(n, *row) for n, row in zip(numels, batch_rows)]
            if self.granularity == "dataset":
                self.pooled = [a.merge(b) for a, b in zip(self.pooled, moments)]
                continue
            scores = self._scores(moments)
            self.counts[batch_vote(scores, self.prior)] += 1
            self.score_sums = [s + t for s, t in zip(self.score_sums, scores)]
        self.pending.clear()

    def _scores(self, moments: Sequence[Moments]) -> list[float]:
        rule = self.rule
        fx, *outs = (gaussian_fit(m, rule.sigma_floor) for m in (moments[0], *moments[2:]))
        fy = label_fit(moments[1], rule.label_fit, rule.num_classes, rule.sigma_floor)
        fits: dict[int, GaussianFit] = dict(zip(self.needed, outs))
        return candidate_scores(fits, fx, fy, self.index, rule.selector, rule.distance)

    def metrics(self) -> dict[str, float]:
        """``vote`` (candidate index, -1 if nothing was scored), ``votes_<l>``, ``s_mean_<l>``."""
        self._score_pending()
        if self.batches == 0:
            return {"vote": -1.0, "scored_batches": 0.0}
        if self.granularity == "dataset":
            means = self._scores(self.pooled)
            counts = [0] * len(self.candidates)
            counts[batch_vote(means, self.prior)] = 1
        else:
            counts, means = self.counts, [s / self.batches for s in self.score_sums]
        out: dict[str, float] = {"vote": float(client_vote(counts, means)), "scored_batches": float(self.batches)}
        for c, name in enumerate(self.candidates):
            out[f"votes_{name}"] = float(counts[c])
            out[f"s_mean_{name}"] = float(means[c])
        return out


def check_option(option: str, value: str, allowed: tuple[str, ...]) -> None:
    """A FedCMD option's value, refused with the allowed ones (the error the role arguments give)."""
    if value not in allowed:
        raise RoleArgsError(f"FedCMD {option} must be one of {list(allowed)}, got {value!r}", option)


@torch.no_grad()
def score_pass(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, scorer: LayerScorer, batch_size: int, device: torch.device
) -> None:
    """One no-grad pass in eval mode over (x, y), scoring every batch (Alg. 2 lines 8-11)."""
    was_training = model.training
    model.eval()
    x, y = x.to(device), y.to(device)
    for start in range(0, len(y), batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        scorer.observe(xb, yb, model.forward_groups(xb))
    model.train(was_training)
