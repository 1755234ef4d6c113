"""FedPAC (Xu, Tong, Huang, "Personalized Federated Learning with Feature Alignment and
Classifier Collaboration", ICLR 2023), the client.

A round, on the received feature extractor (the body, FedAvg'd) and this client's classifier (the
combination the server solved for it last time it took part, else its own):

1. the statistics the server's classifier combination needs, from the received body on the
   training split (eval mode): with p_c the client's share of class c, mu_c its mean feature
   and F_c its features of class c, ``h[c] = p_c * mu_c`` and
   ``v = sum_c (p_c * tr(F_c^T F_c) / n_c - p_c^2 * |mu_c|^2) / N`` (the division by N, the
   client's training examples, as FL-bench's and PFLlib's code do);
2. the classifier alone for ``head_epochs`` epochs at ``head_lr``, the body fixed;
3. the body alone for the round's epochs, the classifier fixed, on
   ``CE + lamda * MSE(features, the global prototype of the label)`` (an example of a class
   without one targets its own features);
4. its class prototypes: the mean features per class of the trained model on the training split
   (eval mode), with the class counts, and the trained classifier, for the server.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option
from pflower.protocol.role_args import RoleArgs

from ..training import TrainArgs, train
from .base import Role, RoleContext
from .fedproto import PROTO, prototype_loss, received_prototypes

HEAD = "fedpac.head/"  # the classifier's tensors: the trained one up, the combined one down
STATS = "fedpac/"  # up: v [1] and h [C, D], the classifier combination's statistics


@torch.no_grad()
def class_features(model: nn.Module, x: torch.Tensor, device: torch.device, batch: int = 512) -> torch.Tensor:
    """The features (the classifier's input) of every example of ``x``, in eval mode."""
    was_training = model.training
    model.eval()
    out = torch.cat([model.features(x[i : i + batch].to(device)).flatten(1) for i in range(0, len(x), batch)])
    model.train(was_training)
    return out


def feature_statistics(features: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[float, torch.Tensor]:
    """(v, h [C, D]) of the module docstring's step 1, from the features [N, D] and labels [N]."""
    means, counts = class_means(features, y, num_classes)
    n = counts.to(features.dtype)
    p = n / n.sum()
    square = torch.zeros(num_classes, dtype=features.dtype, device=features.device)
    square.index_add_(0, y.long(), features.pow(2).sum(1))  # tr(F_c^T F_c)
    v = (p * square / n.clamp(min=1) - p.pow(2) * means.pow(2).sum(1)).sum() / len(y)
    return float(v), p[:, None] * means


def class_means(features: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the mean feature per class [C, D], zero rows for a class absent; the counts [C])."""
    n = torch.bincount(y.long(), minlength=num_classes)
    sums = torch.zeros(num_classes, features.shape[1], dtype=features.dtype, device=features.device)
    sums.index_add_(0, y.long(), features)
    return sums / n.clamp(min=1)[:, None].to(sums), n


@dataclass(frozen=True)
class FedPACArgs(RoleArgs):
    """FedPAC's client: the classifier, then the body with the prototype pull."""

    lamda: float = option(1.0, "weight of the feature alignment term (FL-bench, PFLlib: 1)", low=0)
    head_epochs: int = option(1, "epochs of the classifier alone before the body's (FL-bench, PFLlib: 1)", low=0)
    head_lr: float = option(0.1, "the classifier's learning rate (FL-bench: 0.1; PFLlib: the run's lr)", above=0)
    epoch_split: str = option(
        "extra",
        "extra: the classifier's epochs come on top of the round's (PFLlib) | within: they are the first of the "
        "round's epochs (FL-bench)",
        choices=("extra", "within"),
    )


class FedPACRole(Role):
    name = "fedpac"
    args_type = FedPACArgs

    @staticmethod
    def head_keys(model: nn.Module) -> list[str]:
        prefix = f"groups.{model.group_names[-1]}."
        return [k for k in model.state_dict() if k.startswith(prefix)]

    def take_head(self, model: nn.Module, ctx: RoleContext) -> None:
        """The combined classifier the server sent, if it sent one, replaces this client's."""
        sent = {k[len(HEAD) :]: v for k, v in ctx.received_extra.items() if k.startswith(HEAD)}
        if not sent:
            return
        keys = self.head_keys(model)
        if set(sent) != set(keys):
            raise ValueError(f"the server's classifier holds {sorted(sent)}, this model's {keys}: the models differ")
        model.load_state_dict(sent, strict=False)

    def fit_alone(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict:
        self.take_head(model, ctx)
        model.to(ctx.device)
        num_classes = data.num_classes
        y = data.y_train.to(ctx.device)
        v, h = feature_statistics(class_features(model, data.x_train, ctx.device).double(), y, num_classes)
        head = set(self.head_keys(model))
        params = dict(model.named_parameters())
        head_params = [p for k, p in params.items() if k in head]
        body_params = [p for k, p in params.items() if k not in head]
        common = {"generator": ctx.generator, "device": ctx.device, "kept": ctx.extra_state}
        head_epochs = int(self.args.head_epochs)
        body_args = train_args
        if self.args.epoch_split == "within":
            body_args = replace(train_args, epochs=max(int(train_args.epochs) - head_epochs, 0), steps=None)
        head_loss = float("nan")
        if head_epochs > 0:
            head_args = replace(train_args, epochs=head_epochs, steps=None, lr=float(self.args.head_lr))
            head_loss = train(model, data.x_train, data.y_train, head_args, params=head_params, slot="head", **common)
        protos = received_prototypes(ctx)
        lamda = float(self.args.lamda)
        classifier = model.groups[model.group_names[-1]]

        def aligned_loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            features = module.features(x).flatten(1)
            loss = nn.functional.cross_entropy(classifier(features), y)
            return loss if protos is None else loss + lamda * prototype_loss(features, y, *protos)

        body_loss = train(
            model,
            data.x_train,
            data.y_train,
            body_args,
            params=body_params,
            loss_fn=aligned_loss,
            slot="body",
            **common,
        )
        s, n = class_means(class_features(model, data.x_train, ctx.device), y, num_classes)
        trained = model.state_dict()
        ctx.upload_extra.update(
            {
                PROTO + "s": s.float().cpu(),
                PROTO + "n": n.cpu(),
                STATS + "v": torch.tensor([v], dtype=torch.float64),
                STATS + "h": h.float().cpu(),
                **{HEAD + k: trained[k].detach().cpu().clone() for k in sorted(head)},
            }
        )
        out = {"train_loss": body_loss, "feature_variance": v}
        if head_loss == head_loss:  # not NaN: the classifier trained
            out["head_loss"] = head_loss
        return out

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        self.take_head(model, ctx)  # test_before scores the received body with the combined classifier
        return model
