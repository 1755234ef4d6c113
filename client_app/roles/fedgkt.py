"""FedGKT's client side (FedGKT paper, Algorithm 1, the client's part): train the whole small model
with cross-entropy plus distillation toward the server's logits of the same samples, then send
the features (classifier inputs), logits and labels of the training split, and the features and
labels of the test split (the server measures its model on them).

The server's logits are per training sample, row i for sample i of the client's training split.
Training goes through :func:`client_app.training.train` with the sample *indices* as targets,
so the batches and their order are exactly those of every other role; the loss looks the labels
and the server's logits up by index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pflower.federated_data import ClientData
from pflower.models.gkt import ExtractorThenHead, kd_loss, server_head
from pflower.protocol.options import option, sent
from pflower.protocol.role_args import RoleArgs, RoleArgsError

from ..training import TrainArgs, train
from .base import Role, RoleContext

GKT = "gkt/"  # the extra arrays: gkt/<h|z|y|ht|yt> up, gkt/z and gkt/server/<key> down
SERVER = GKT + "server/"


@dataclass(frozen=True)
class FedGKTArgs(RoleArgs):
    """FedGKT's client: its whole model trained with CE + alpha x the distillation loss against the
    server's logits of its training samples (``gkt/z`` [N, C]; none in its first round: CE only);
    it sends the features, logits and labels of its training split and the features and labels of
    its test split, and is evaluated as its feature extractor followed by the server's model (an
    MLP of ``hidden`` widths on features of width ``feature_dim``, sent as ``gkt/server/<key>``)."""

    alpha: float = option(1.0, "weight of the distillation term on both sides", low=0)
    temperature: float = option(3.0, "distillation temperature T", above=0)
    hidden: list[int] = option([256, 256], "the server model's hidden widths (an MLP on the clients' features)")
    feature_dim: int = sent(0, "the width of the features the clients share (from the model)", low=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if any(int(h) < 1 for h in self.hidden):
            raise RoleArgsError(f"option hidden: every width must be >= 1, got {self.hidden}", "hidden")


def gkt_loss(labels: torch.Tensor, teacher: torch.Tensor | None, alpha: float, temperature: float):
    """The client's loss of a batch of sample indices: CE, plus alpha x :func:`kd_loss` against the
    server's logits ``teacher`` [N, C] when the server sent them."""

    def loss(model: nn.Module, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        ce = F.cross_entropy(logits, labels[idx.cpu()].to(logits.device))
        if teacher is None or alpha == 0:
            return ce
        return ce + alpha * kd_loss(logits, teacher[idx.cpu()].to(logits.device), temperature)

    return loss


@torch.no_grad()
def features_and_logits(
    model: nn.Module, x: torch.Tensor, device: torch.device, batch_size: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """The evaluation-mode classifier inputs [N, D] and logits [N, C] of ``x``, in order."""
    was_training = model.training
    model.eval()
    feats, logits = [], []
    try:
        for start in range(0, len(x), batch_size):
            h = model.features(x[start : start + batch_size].to(device)).flatten(1)
            feats.append(h.cpu())
            logits.append(list(model.groups.values())[-1](h).cpu())
    finally:
        model.train(was_training)
    return torch.cat(feats), torch.cat(logits)


class FedGKTRole(Role):
    """Distil toward the server's logits; upload features, logits and labels."""

    name = "fedgkt"
    args_type = FedGKTArgs

    def head(self, model: nn.Module, ctx: RoleContext) -> nn.Module | None:
        """The server's model from the message (None if it was not sent)."""
        weights = {k[len(SERVER) :]: v for k, v in ctx.received_extra.items() if k.startswith(SERVER)}
        if not weights:
            return None
        num_classes = int(list(model.groups.values())[-1].out_features)
        head = server_head(self.args.feature_dim, num_classes, self.args.hidden, seed=0)
        head.load_state_dict(weights)
        return head.to(ctx.device)

    def fit(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict[str, float]:
        teacher = ctx.received_extra.get(GKT + "z")
        if teacher is not None and tuple(teacher.shape) != (data.num_train, data.num_classes):
            raise ValueError(
                f"fedgkt: the server sent logits of shape {tuple(teacher.shape)} for {data.num_train} training "
                f"samples of {data.num_classes} classes (a client's data must not change within a run)"
            )
        order = torch.arange(data.num_train)
        loss_fn = gkt_loss(data.y_train.to(torch.int64), teacher, self.args.alpha, self.args.temperature)
        loss = train(
            model,
            data.x_train,
            order,
            train_args,
            loss_fn=loss_fn,
            generator=ctx.generator,
            device=ctx.device,
            kept=ctx.extra_state,
        )
        h, z = features_and_logits(model, data.x_train, ctx.device)
        ht, _ = features_and_logits(model, data.x_test, ctx.device)
        ctx.upload_extra.update(
            {
                GKT + "h": h.float(),
                GKT + "z": z.float(),
                GKT + "y": data.y_train.to(torch.int64),
                GKT + "ht": ht.float(),
                GKT + "yt": data.y_test.to(torch.int64),
            }
        )
        return {"train_loss": loss}

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        head = self.head(model, ctx)
        return model if head is None else ExtractorThenHead(model, head)

    def trained_model(self, model: nn.Module, ctx: RoleContext) -> nn.Module:
        head = self.head(model, ctx)
        return model if head is None else ExtractorThenHead(model, head)
