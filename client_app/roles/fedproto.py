"""FedProto (Tan et al., "FedProto: Federated Prototype Learning across Heterogeneous Clients",
AAAI 2022), the client: its own model, trained on cross-entropy plus ``lamda`` times the MSE
between each example's features and the global prototype of its class, and this round's class
prototypes (the mean training features per class) for the server.

The features are the classifier's input (``model.features``); a class with no global prototype
yet targets the example's own features (no pull, as FL-bench and PFLlib do), and the MSE is the
mean over the batch and the feature width. The prototypes are summed over every training pass
of the round (all epochs, train-mode BN), as the three codes (the authors', FL-bench, PFLlib)
collect them.

Prediction is an option: ``inference=prototype`` (the paper and PFLlib) labels an example with
the class of the nearest global prototype (squared distance; the classifier until the client has
received any); ``inference=classifier`` (FL-bench) uses the model's own classifier.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option, sent
from pflower.protocol.role_args import RoleArgs

from ..training import TrainArgs
from .base import Role, RoleContext, train_own
from .felo_knowledge import ClassKnowledge

PROTO = "proto/"  # extra arrays: S [C, D] and M [C] (the known classes) down; s [C, D] and n [C] up
INFERENCES = ("prototype", "classifier")
NEVER = 100.0  # nats below the least likely known class: the score of a class without a prototype


def prototype_targets(
    features: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, known: torch.Tensor
) -> torch.Tensor:
    """Each example's target: its class's global prototype where the class has one, else its own
    features, detached (so that example adds nothing to the pull)."""
    has = known.bool()[y]
    return torch.where(has[:, None], protos[y].to(features), features.detach())


def prototype_loss(features: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """The regulariser: MSE between the features [B, D] and their targets, over all B x D entries."""
    return nn.functional.mse_loss(features, prototype_targets(features, y, protos, known))


def nearest_prototype_scores(features: torch.Tensor, protos: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """[B, C] scores whose argmax is the nearest known prototype: minus the squared distance; a
    class without a prototype scores ``NEVER`` below the row's lowest known class (finite, so the
    evaluation's cross-entropy stays a number, and e^-100 of the probability: never predicted)."""
    # the differences squared and summed, not torch.cdist: cdist takes a matrix-product path for
    # more than 25 rows, whose last bits depend on the CPU's BLAS kernels (the pinned numbers moved
    # between two x86-64 machines), and x^2 + y^2 - 2xy loses digits where a feature is near its prototype
    scores = -(features[:, None, :] - protos.to(features)[None, :, :]).pow(2).sum(-1)
    unknown = ~known.bool()[None, :].to(scores.device)
    floor = scores.masked_fill(unknown, float("inf")).amin(1, keepdim=True) - NEVER
    return torch.where(unknown, floor, scores)


def received_prototypes(ctx: RoleContext) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The global prototypes S [C, D] and their mask M [C] the server sent (FedProto, FedPAC); None
    when it sent none or knows no class yet."""
    if PROTO + "S" not in ctx.received_extra:
        return None
    if PROTO + "M" not in ctx.received_extra:
        raise ValueError("the server's prototypes come without their mask: server and client pflower differ")
    known = ctx.received_extra[PROTO + "M"].to(ctx.device)
    return (ctx.received_extra[PROTO + "S"].to(ctx.device), known) if bool(known.any()) else None


class PrototypeClassifier(nn.Module):
    """The client's model predicting by the nearest global prototype (``inference=prototype``)."""

    def __init__(self, net: nn.Module, protos: torch.Tensor, known: torch.Tensor) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("protos", protos)
        self.register_buffer("known", known)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nearest_prototype_scores(self.net.features(x).flatten(1), self.protos, self.known)


@dataclass(frozen=True)
class FedProtoArgs(RoleArgs):
    """FedProto's client: CE + lamda * MSE(features, the global prototype of the label)."""

    lamda: float = option(1.0, "weight of the prototype term (the paper's lambda; FL-bench, PFLlib: 1)", low=0)
    inference: str = option(
        "prototype",
        "prototype: the nearest global prototype's class (paper, PFLlib) | classifier: the model's own (FL-bench)",
        choices=INFERENCES,
    )
    feature_dim: int = sent(0, "the width of the features the clients share (0: not checked)", low=0)


class FedProtoRole(Role):
    name = "fedproto"
    args_type = FedProtoArgs

    def fit_alone(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict:
        head = list(model.groups.values())[-1]
        num_classes, feature_dim = int(head.weight.shape[0]), int(head.weight.shape[1])
        if self.args.feature_dim and feature_dim != self.args.feature_dim:
            raise ValueError(
                f"this client's model ends in {feature_dim} features, the federation shares {self.args.feature_dim}: "
                "give every architecture the same model.feature_dim"
            )
        received = received_prototypes(ctx)
        acc = ClassKnowledge(num_classes, feature_dim, ctx.device)
        lamda = float(self.args.lamda)
        pulls: list[torch.Tensor] = []

        def proto_loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            features = module.features(x).flatten(1)
            logits = head(features)
            acc.add(features, logits, y)
            loss = nn.functional.cross_entropy(logits, y)
            if received is None:
                return loss
            pull = prototype_loss(features, y, *received)
            pulls.append(pull.detach())
            return loss + lamda * pull

        loss = train_own(model, data, train_args, ctx, loss_fn=proto_loss)
        s, _, n = acc.means()
        ctx.upload_extra.update({PROTO + "s": s, PROTO + "n": n})
        return {"train_loss": loss, "proto_loss": float(torch.stack(pulls).mean()) if pulls else 0.0}

    def predictor(self, model: nn.Module, ctx: RoleContext) -> nn.Module:
        """What ``test_before`` and ``test_after`` score: the model, or with ``inference=prototype``
        and prototypes received, the model's features against them."""
        received = received_prototypes(ctx)
        if self.args.inference == "classifier" or received is None:
            return model
        return PrototypeClassifier(model, *received)

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        return self.predictor(model, ctx)

    def trained_model(self, model: nn.Module, ctx: RoleContext) -> nn.Module:
        return self.predictor(model, ctx)
