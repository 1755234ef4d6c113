"""HeteroFL's client side (HeteroFL paper): SGD on the width-scaled sub-model the server cut for this
client, with the paper's masked cross-entropy and static batch normalisation.

The masked loss zeroes the logits of the classes this client has no training sample of, so its
classifier rows of those classes get no gradient (the server then averages each row over the
clients that have the class: ``heterofl/classes``). Static BN (sBN): the BN layers' running
statistics are not used from training; before every evaluation they are computed afresh from
the local training split with the model as it will be evaluated (scalers off, the evaluation
mode), a cumulative mean over the batches in order.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pflower.federated_data import ClientData
from pflower.models.schema import batchnorm_layers
from pflower.protocol.options import option
from pflower.protocol.role_args import RoleArgs

from ..training import TrainArgs, cross_entropy
from .base import Role, RoleContext, train_own


def class_presence(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[C] uint8: 1 for every class with at least one sample in ``y``."""
    present = torch.zeros(num_classes, dtype=torch.uint8)
    present[torch.unique(y.to(torch.int64)).clamp(0, num_classes - 1)] = 1
    return present


def masked_cross_entropy(classes: torch.Tensor):
    """The cross-entropy of logits whose absent classes (``classes`` == 0) are set to 0 (HeteroFL's
    masked loss for non-IID clients)."""

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        absent = (classes == 0).to(logits.device)
        return F.cross_entropy(logits.masked_fill(absent, 0.0), y)

    return loss


@torch.no_grad()
def static_bn_statistics(model: nn.Module, x: torch.Tensor, device: torch.device, batch_size: int = 256) -> None:
    """Set every BN layer's running mean and variance to the cumulative mean over ``x``'s batches
    (in order) of the batch statistics the evaluation-mode model produces (sBN). In place."""
    layers = batchnorm_layers(model)
    if not layers or len(x) == 0:
        return
    was_training = model.training
    momenta = [m.momentum for m in layers]
    model.eval()
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # a cumulative moving average: every batch counts alike
        m.train()
    try:
        for start in range(0, len(x), batch_size):
            model(x[start : start + batch_size].to(device))
    finally:
        for m, momentum in zip(layers, momenta):
            m.momentum = momentum
        model.train(was_training)


HETEROFL_CLASSES = "heterofl/classes"  # the extra array of a reply: which classes the client has


@dataclass(frozen=True)
class HeteroFLArgs(RoleArgs):
    """HeteroFL's client: SGD on its width-scaled sub-model. ``label_split``: the logits of the classes
    the client has no sample of are zeroed, and its class presence travels as ``heterofl/classes``
    [C] (the server averages a classifier row over the clients that have its class). ``static_bn``:
    statistics are not tracked in training but computed from the training split before every
    evaluation."""

    label_split: bool = option(
        True, "masked cross-entropy and per-class classifier rows (the paper's non-IID training)"
    )
    static_bn: bool = option(True, "static BN: statistics from the local training split before each evaluation")


class HeteroFLRole(Role):
    """SGD on the sub-model; masked loss and sBN as the arguments say."""

    name = "heterofl"
    args_type = HeteroFLArgs

    def fit(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict[str, float]:
        loss_fn = cross_entropy
        if self.args.label_split:
            classes = class_presence(data.y_train, data.num_classes)
            ctx.upload_extra[HETEROFL_CLASSES] = classes
            loss_fn = masked_cross_entropy(classes)
        loss = train_own(model, data, train_args, ctx, loss_fn)
        if self.args.static_bn:
            static_bn_statistics(model, data.x_train, ctx.device)  # for test_after
        return {"train_loss": loss}

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        if not self.args.static_bn:
            return model
        measured = copy.deepcopy(model)
        static_bn_statistics(measured, data.x_train, ctx.device)
        return measured
