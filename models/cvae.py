"""Velo's conditional VAE over class features (Felo/Velo paper, Algorithm 2 (Velo's server), [A-H]).

Four dense layers: the encoder maps (feature, label embedding) through Linear + BatchNorm + ReLU
to (mu, log sigma^2); the decoder maps (z, label embedding) through two Linear layers (no
activation between, linear output: the paper's code). Defaults for 512-dim features: label
embedding 512, hidden 1024, latent 512. The server trains it on the stored class features every
``cvae_interval`` rounds (Adam re-created per call, weights kept; ``optim.PlainAdam``, whose
square root is correctly rounded, so the run does not depend on the CPU) and sends one decoded feature
per class, drawn from N(0, I) with the round's seed, instead of the class mean.

Loss: ``elbo`` (default) sums the squared error over D and the KL over Z per sample and averages
over the batch; ``code`` is the paper's code: MSE averaged over all B*D elements plus the KL
summed over batch and latent dims (beta = 1 in both).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .optim import PlainAdam

CVAE_LOSSES = ("elbo", "code")


class CVAE(nn.Module):
    def __init__(
        self, feature_dim: int, num_classes: int, label_dim: int = 512, hidden: int = 1024, latent: int = 512
    ) -> None:
        super().__init__()
        self.feature_dim, self.num_classes, self.latent = feature_dim, num_classes, latent
        self.embed = nn.Embedding(num_classes, label_dim)
        self.enc = nn.Sequential(nn.Linear(feature_dim + label_dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU())
        self.enc_out = nn.Linear(hidden, 2 * latent)
        self.dec = nn.Sequential(nn.Linear(latent + label_dim, hidden), nn.Linear(hidden, feature_dim))

    def encode(self, features: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.enc(torch.cat([features, self.embed(labels)], dim=1))
        mu, logvar = self.enc_out(h).chunk(2, dim=1)
        return mu, logvar

    def decode(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.dec(torch.cat([z, self.embed(labels)], dim=1))

    def forward(self, features: torch.Tensor, labels: torch.Tensor, generator: torch.Generator | None = None):  # noqa: ANN201
        """(reconstruction [B, D], mu [B, Z], logvar [B, Z]) with one reparameterized sample."""
        mu, logvar = self.encode(features, labels)
        eps = torch.randn(mu.shape, generator=generator).to(mu)  # a CPU generator, on any device
        return self.decode(mu + torch.exp(0.5 * logvar) * eps, labels), mu, logvar

    @torch.no_grad()
    def synthesize(self, generator: torch.Generator, per_class: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """``per_class`` decoded features of every class [C * per_class, D] and their labels; the
        same generator state gives the same features (one draw per round for every client)."""
        labels = torch.arange(self.num_classes, device=self.embed.weight.device).repeat_interleave(per_class)
        z = torch.randn((len(labels), self.latent), generator=generator, device="cpu").to(self.embed.weight.device)
        was = self.training
        self.eval()
        try:
            return self.decode(z, labels), labels
        finally:
            self.train(was)


def cvae_loss(
    recon: torch.Tensor,
    target: torch.Tensor,
    mu: torch.Tensor,
    logvar: torch.Tensor,
    kind: str = "elbo",
    beta: float = 1.0,
) -> torch.Tensor:
    """The negative ELBO (Eq. 2) in the ``kind`` scaling (module docstring)."""
    kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp())  # [B, Z]
    if kind == "elbo":
        return (recon - target).pow(2).sum(dim=1).mean() + beta * kl.sum(dim=1).mean()
    if kind == "code":
        return F.mse_loss(recon, target) + beta * kl.sum()
    raise ValueError(f"cvae_loss must be one of {list(CVAE_LOSSES)}, got {kind!r}")


def train_cvae(
    model: CVAE,
    features: torch.Tensor,
    labels: torch.Tensor,
    generator: torch.Generator,
    epochs: int = 10,
    batch_size: int = 50,
    lr: float = 1e-3,
    kind: str = "elbo",
) -> list[float]:
    """Train on (features [N, D], labels [N]) with a fresh Adam; returns each epoch's mean loss.

    Batches of one are skipped (BatchNorm needs two rows). ``generator`` (CPU) draws the
    shuffles and the reparameterization noise, so a resumed server trains identically.
    """
    if kind not in CVAE_LOSSES:
        raise ValueError(f"cvae_loss must be one of {list(CVAE_LOSSES)}, got {kind!r}")
    device = model.embed.weight.device
    features, labels = features.to(device, torch.float32), labels.to(device, torch.int64)
    opt = PlainAdam(model.parameters(), lr=lr)  # torch.optim.Adam's update, the same bits on every CPU
    model.train()
    history: list[float] = []
    for _ in range(epochs):
        order = torch.randperm(len(labels), generator=generator).to(device)
        total, batches = 0.0, 0
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            if len(idx) < 2:
                continue
            mu, logvar = model.encode(features[idx], labels[idx])
            eps = torch.randn(mu.shape, generator=generator).to(device)
            recon = model.decode(mu + torch.exp(0.5 * logvar) * eps, labels[idx])
            loss = cvae_loss(recon, features[idx], mu, logvar, kind)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, batches = total + float(loss.detach()), batches + 1
        history.append(total / max(batches, 1))
    return history
