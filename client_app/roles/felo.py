"""Felo / Velo / FedHe's client side (Felo/Velo paper, Algorithm 1, client side): training against the server's class
knowledge, and this round's class knowledge for the server.

One forward pass per batch gives the features (``model.features``: every group but the
classifier, flattened) and the logits; the per-class sums of both are taken from these training
passes (train-mode BN, before each step, warm-up included) and sent up as class means with their
counts (or, with ``feature_samples`` N, the last N per-sample features and their labels
instead of the class means, Felo/Velo paper, the authors' code's per-sample feature upload). The loss is Eq. 1
(client_app/roles/felo_knowledge.py); without knowledge from the
server (the warm-up rounds, or before any class is known) it is CE alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option, sent
from pflower.protocol.role_args import RoleArgs

from .base import Role, RoleContext, train_own
from .felo_knowledge import ClassKnowledge, FeatureSamples, felo_loss

KNOWLEDGE = "knowledge/"  # extra arrays: S, P, M down; s (or f, y), p, n up
FEATURE_UPLOADS = ("class_mean", "samples")


@dataclass(frozen=True)
class FeloArgs(RoleArgs):
    """Felo / Velo / FedHe's client (Felo/Velo paper, Algorithm 1, client side): CE + alpha *
    (mse_weight * feature MSE + KL of the logits) against the server's class knowledge (extra arrays
    ``knowledge/S|P|M``; none sent: CE only, the warm-up). It uploads its per-class mean features,
    logits and counts (``knowledge/s|p|n``) of width ``feature_dim``, or with
    ``feature_upload=samples`` (the authors' code) its last ``feature_samples`` per-sample training
    features ``knowledge/f`` [N, D] and their labels ``knowledge/y`` [N] (-1 pads a round that saw
    fewer) instead of the class means. FedHe: ``mse_weight`` 0 (logits only)."""

    alpha: float = option(0.5, "weight of the distillation terms in Eq. 1", low=0)
    temperature: float = option(1.0, "KL temperature", above=0)
    feature_upload: str = option(
        "class_mean",
        "class_mean: per-class means (the paper) | samples: per-sample features (the authors' code)",
        choices=FEATURE_UPLOADS,
    )
    feature_samples: int = option(500, "samples: features a client sends a round (its last ones)", low=1)
    mse_weight: float = sent(1.0, "weight of the feature term (the method's: FedHe 0)", low=0)
    feature_dim: int = sent(0, "the width of the features the clients share (0: not checked)", low=0)

    def samples_sent(self) -> int:
        """N, the per-sample features a round uploads (0: the class means)."""
        return self.feature_samples if self.feature_upload == "samples" else 0


class FeloRole(Role):
    name = "felo"
    args_type = FeloArgs

    def fit(self, model: nn.Module, data: ClientData, train_args, ctx: RoleContext) -> dict[str, float]:  # noqa: ANN001
        head = list(model.groups.values())[-1]
        received = {k[len(KNOWLEDGE) :]: v for k, v in ctx.received_extra.items() if k.startswith(KNOWLEDGE)}
        knowledge = None
        if received:
            needed = {"S", "P", "M"} if self.args.mse_weight > 0 else {"P", "M"}
            missing = sorted(needed - set(received))
            if missing:
                raise ValueError(f"the server's class knowledge lacks {missing}: server and client pflower differ")
        num_classes = int(head.weight.shape[0])
        feature_dim = int(head.weight.shape[1])
        if received:
            S = received.get("S", torch.zeros(num_classes, feature_dim))  # FedHe: no feature term
            knowledge = (S.to(ctx.device), received["P"].to(ctx.device), received["M"].to(ctx.device))
        if self.args.feature_dim and feature_dim != self.args.feature_dim:
            raise ValueError(
                f"this client's model ends in {feature_dim} features, the federation shares {self.args.feature_dim}: "
                "give every architecture the same model.feature_dim"
            )
        acc = ClassKnowledge(num_classes, feature_dim, ctx.device)
        n = self.args.samples_sent()
        samples = FeatureSamples(n, feature_dim, ctx.device) if n else None
        sums = {"ce": 0.0, "mse": 0.0, "kl": 0.0}
        steps = [0]
        alpha, mse_weight, temperature = self.args.alpha, self.args.mse_weight, self.args.temperature

        def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            features = model.features(x).flatten(1)
            logits = head(features)
            acc.add(features, logits, y)
            if samples is not None:
                samples.add(features, y)
            loss, terms = felo_loss(features, logits, y, alpha, knowledge, temperature, mse_weight)
            for k in sums:
                sums[k] += terms[k]
            steps[0] += 1
            return loss

        loss = train_own(model, data, train_args, ctx, loss_fn)
        s, p, n = acc.means()
        ctx.upload_extra.update({KNOWLEDGE + "p": p, KNOWLEDGE + "n": n})
        if samples is not None:
            f, labels = samples.arrays()
            ctx.upload_extra.update({KNOWLEDGE + "f": f, KNOWLEDGE + "y": labels})
        elif self.args.mse_weight > 0:
            ctx.upload_extra[KNOWLEDGE + "s"] = s
        return {
            "train_loss": loss,
            **{f"{k}_loss": v / max(steps[0], 1) for k, v in sums.items()},
            "distill": float(knowledge is not None),
        }
