"""Felo/Velo's client-side math (Felo/Velo paper, Algorithm 1, client side): per-class knowledge and the distillation
terms.

A client sends the server, per class, the mean of the features and of the logits its training
forward passes produced this round (train-mode BN, taken before each optimizer step, every local
step, warm-up included) and how many samples each mean is over. It trains on CE plus
``alpha * (mse + kl)`` against the server's class features ``S`` and class logits ``P``, for the
samples whose class the server has knowledge of (mask ``M``; [A-E] the paper's code would crash
on a class without any). Plain torch functions, unit-tested on hand-built tensors; the role
(client_app/roles) and the strategy build on them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class ClassKnowledge:
    """Running per-class sums of features [C, D] and logits [C, C] and the sample counts [C]."""

    def __init__(self, num_classes: int, feature_dim: int, device: torch.device | str = "cpu") -> None:
        self.feature_sum = torch.zeros(num_classes, feature_dim, dtype=torch.float64, device=device)
        self.logit_sum = torch.zeros(num_classes, num_classes, dtype=torch.float64, device=device)
        self.count = torch.zeros(num_classes, dtype=torch.int64, device=device)

    @torch.no_grad()
    def add(self, features: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Accumulate one batch: ``features`` [B, D], ``logits`` [B, C], integer ``labels`` [B]."""
        labels = labels.to(self.count.device, torch.int64)
        self.feature_sum.index_add_(0, labels, features.detach().to(self.feature_sum))
        self.logit_sum.index_add_(0, labels, logits.detach().to(self.logit_sum))
        self.count += torch.bincount(labels, minlength=len(self.count))

    def means(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(s [C, D], p [C, C], n [C]) as float32 / int64: the class means, zero rows where n = 0."""
        div = self.count.clamp(min=1).to(self.feature_sum)[:, None]
        return (self.feature_sum / div).float(), (self.logit_sum / div).float(), self.count.clone()


class FeatureSamples:
    """The last ``capacity`` per-sample training features and their labels (the "samples"
    upload, Felo/Velo paper, the authors' code's per-sample feature upload): a ring buffer on the model's device, read
    out oldest first and
    padded with label -1 to the fixed upload shape [capacity, D]."""

    def __init__(self, capacity: int, feature_dim: int, device: torch.device | str = "cpu") -> None:
        self.features = torch.zeros(capacity, feature_dim, dtype=torch.float32, device=device)
        self.labels = torch.full((capacity,), -1, dtype=torch.int64, device=device)
        self.seen = 0

    @torch.no_grad()
    def add(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        cap = len(self.labels)
        features, labels = features.detach()[-cap:], labels.detach()[-cap:]
        slots = (self.seen + torch.arange(len(labels), device=self.labels.device)) % cap
        self.features[slots] = features.to(self.features)
        self.labels[slots] = labels.to(self.labels)
        self.seen += len(labels)

    def arrays(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(f [N, D], y [N]) oldest first; rows never written have label -1 and zero features."""
        cap = len(self.labels)
        if self.seen <= cap:
            return self.features.clone(), self.labels.clone()
        order = (torch.arange(cap, device=self.labels.device) + self.seen) % cap
        return self.features[order], self.labels[order]


def distill_terms(
    features: torch.Tensor,
    logits: torch.Tensor,
    labels: torch.Tensor,
    class_features: torch.Tensor,
    class_logits: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The feature MSE and the logit KL of Eq. 1, over the batch rows whose class has knowledge.

    ``class_features`` S [C, D] and ``class_logits`` P [C, C] are targets (no gradient reaches
    the server's values); ``mask`` M [C] marks the classes that have them. Reductions as the
    paper's code ([A-E]): MSE is the element mean over (kept rows x D); KL(softmax(P[y]/T) ||
    softmax(logit/T)) is ``F.kl_div(..., reduction="mean")``, the sum over (kept rows x C)
    divided by their number. A batch without a kept row gives two zeros (still differentiable).
    The MSE's gradient reaches only the extractor (it does not involve the classifier).
    """
    keep = mask.to(torch.bool)[labels]
    if not bool(keep.any()):
        zero = features.sum() * 0.0
        return zero, zero
    y = labels[keep]
    mse = F.mse_loss(features[keep], class_features[y].detach().to(features))
    target = F.softmax(class_logits[y].detach().to(logits) / temperature, dim=1)
    # F.kl_div(..., reduction="mean") without its every-call warning: the sum over the elements
    kl = F.kl_div(F.log_softmax(logits[keep] / temperature, dim=1), target, reduction="sum") / target.numel()
    return mse, kl


def felo_loss(
    features: torch.Tensor,
    logits: torch.Tensor,
    labels: torch.Tensor,
    alpha: float,
    knowledge: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    temperature: float = 1.0,
    mse_weight: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Eq. 1: CE + alpha (mse_weight MSE + KL); ``knowledge`` None (warm-up, or no class known
    yet): CE only. ``mse_weight`` 0 is FedHe (logits only). Returns the loss and its (unweighted)
    terms as floats for the round's metrics."""
    ce = F.cross_entropy(logits, labels)
    if knowledge is None or alpha == 0:
        return ce, {"ce": float(ce.detach()), "mse": 0.0, "kl": 0.0}
    mse, kl = distill_terms(features, logits, labels, *knowledge, temperature=temperature)
    loss = ce + alpha * (mse_weight * mse + kl)
    return loss, {"ce": float(ce.detach()), "mse": float(mse.detach()), "kl": float(kl.detach())}
