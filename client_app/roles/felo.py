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

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.roles import FeloArgs

from .base import Role, RoleContext, train_own
from .felo_knowledge import ClassKnowledge, FeatureSamples, felo_loss

KNOWLEDGE = "knowledge/"  # extra arrays: S, P, M down; s (or f, y), p, n up


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
        samples = (
            FeatureSamples(self.args.feature_samples, feature_dim, ctx.device) if self.args.feature_samples else None
        )
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
