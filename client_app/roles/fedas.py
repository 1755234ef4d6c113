"""FedAS (Yang, Huang, Ye, "FedAS: Bridging Inconsistency in Personalized Federated Learning",
CVPR 2024), the client.

A round, on the received model (the global feature extractor, with this client's classifier under
``head=personal``, or the global one under ``head=shared``):

1. *parameter alignment* (from the second time the client takes part): the class prototypes of
   the client's own previous model (its mean features per class on the training split, eval
   mode) anchor the received extractor, trained alone for ``alignment_epochs`` at
   ``alignment_lr`` (plain SGD) on the distance of its features to them: ``alignment=sample``,
   the MSE of every example's features to its class's prototype, summed over the batch's
   classes (PFLlib); ``batch_mean``, the MSE of the batch's class means (FL-bench);
2. the round's training of the whole model (cross-entropy);
3. the trace of its Fisher information on the training split (eval mode; per batch, the squared
   gradients of the mean negative log-likelihood, summed over parameters and batches: both
   peers' estimate), sent as the metric ``fim_trace``: the server's aggregation weight (*client
   synchronization*).

The trained model is kept (``ctx.extra_state``): the next round's prototypes come from it, and
under ``scored=previous`` it is what ``test_before`` scores (PFLlib's evaluation, and FL-bench's
periodic test; at first contact, the received model); ``scored=aligned`` scores the received model
after the alignment instead (FL-bench's per-round ``test_before``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option
from pflower.protocol.role_args import RoleArgs

from ..training import TrainArgs, train
from .base import Role, RoleContext, train_own
from .fedpac import class_features, class_means

PREV = "fedas.prev."  # the client's last trained model in ctx.extra_state
ALIGNMENTS = ("sample", "batch_mean")
HEADS = ("personal", "shared")
SCORED = ("previous", "aligned")


def alignment_loss(
    features: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, known: torch.Tensor, mode: str = "sample"
) -> torch.Tensor:
    """The distance of a batch's features [B, D] to the prototypes [C, D] of their classes (those
    ``known``), summed over the batch's classes: per example (``sample``) or of the class mean
    (``batch_mean``)."""
    loss = features.new_zeros(())
    for c in y.unique().tolist():
        if not bool(known[c]):
            continue
        mine = features[y == c]
        if mode == "batch_mean":
            mine = mine.mean(0, keepdim=True)
        loss = loss + nn.functional.mse_loss(mine, protos[c].expand_as(mine))
    return loss


def fisher_trace(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int, device: torch.device) -> float:
    """sum over batches of sum_params |grad of the batch's mean NLL|^2, in eval mode."""
    was_training = model.training
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    total = torch.zeros((), dtype=torch.float64, device=device)
    for i in range(0, len(x), batch_size):
        xb, yb = x[i : i + batch_size].to(device), y[i : i + batch_size].to(device)
        nll = nn.functional.cross_entropy(model(xb), yb)
        grads = torch.autograd.grad(nll, params, allow_unused=True)
        total += sum((g.double() ** 2).sum() for g in grads if g is not None)
    model.train(was_training)
    return float(total)


@dataclass(frozen=True)
class FedASArgs(RoleArgs):
    """FedAS's client: parameter alignment to its own prototypes, training, its Fisher trace."""

    alignment_lr: float = option(0.01, "the alignment's SGD rate (FL-bench, PFLlib: 0.01)", above=0)
    alignment_epochs: int = option(1, "epochs of the alignment (FL-bench, PFLlib: 1)", low=0)
    alignment: str = option(
        "sample",
        "sample: every example's features to its class prototype (PFLlib) | batch_mean: the batch's class means "
        "(FL-bench)",
        choices=ALIGNMENTS,
    )
    head: str = option(
        "personal",
        "personal: the classifier stays on the client, the extractor is shared (PFLlib) | shared: the whole model "
        "is averaged (FL-bench)",
        choices=HEADS,
    )
    scored: str = option(
        "previous",
        "what test_before scores: previous: the client's last trained model (PFLlib) | aligned: the received "
        "model after the alignment (FL-bench's per-round test_before)",
        choices=SCORED,
    )


class FedASRole(Role):
    name = "fedas"
    args_type = FedASArgs

    def previous(self, model: nn.Module, ctx: RoleContext) -> nn.Module | None:
        """The client's last trained model (None at first contact)."""
        kept = ctx.kept(PREV)
        if not kept:
            return None
        prev = copy.deepcopy(model)
        prev.load_state_dict(kept)
        return prev

    aligned_loss: float | None = None  # this round's alignment loss, once aligned

    def align(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> None:
        """Step 1 of the module docstring, once a round (before test_before under scored=aligned,
        else before training); its mean loss in :attr:`aligned_loss` (None: nothing to align to)."""
        if getattr(self, "_aligned", False):
            return
        self._aligned = True
        model.to(ctx.device)
        prev = self.previous(model, ctx)
        epochs = int(self.args.alignment_epochs)
        if prev is None or epochs <= 0:
            return
        y = data.y_train.to(ctx.device)
        protos, counts = class_means(class_features(prev.to(ctx.device), data.x_train, ctx.device), y, data.num_classes)
        known = counts > 0
        head = f"groups.{model.group_names[-1]}."
        body = [p for k, p in model.named_parameters() if not k.startswith(head)]
        mode = self.args.alignment

        def align_loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return alignment_loss(module.features(x).flatten(1), y, protos, known, mode)

        plain = replace(
            train_args,
            epochs=epochs,
            steps=None,
            lr=float(self.args.alignment_lr),
            optimizer="sgd",
            momentum=0.0,
            weight_decay=0.0,
            optimizer_state="fresh",
        )
        self.aligned_loss = train(
            model,
            data.x_train,
            data.y_train,
            plain,
            params=body,
            loss_fn=align_loss,
            generator=ctx.generator,
            device=ctx.device,
        )

    def fit_alone(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict:
        self.align(model, data, train_args, ctx)
        out = {} if self.aligned_loss is None else {"alignment_loss": self.aligned_loss}
        out["train_loss"] = train_own(model, data, train_args, ctx)
        out["fim_trace"] = fisher_trace(model, data.x_train, data.y_train, int(train_args.batch_size), ctx.device)
        ctx.keep(PREV, model.state_dict())
        return out

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        if self.args.scored == "aligned":
            self.align(model, data, train_args, ctx)
            return model
        prev = self.previous(model, ctx)
        return model if prev is None else prev

    def trained_model(self, model: nn.Module, ctx: RoleContext) -> nn.Module:
        return model
