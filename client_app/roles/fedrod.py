"""FedRoD (Chen & Chao, "On Bridging Generic and Personalized Federated Learning for Image
Classification", ICLR 2022): two predictors on one shared body.

The received model (body and generic head, both FedAvg'd) trains on the balanced softmax loss:
cross-entropy on the generic head's logits plus the log of the client's own label counts, which
removes the client's label skew from what the generic head learns. A personalized head, a copy of
the classifier that never leaves the client (``ctx.extra_state``), learns the client's own
distribution by cross-entropy. Its reading is an option:

- ``personal_head=on_generic`` (the paper's "on top of the generic predictor", and PFLlib's
  code): the personalized logits are the generic head's plus the personal head's, the personal
  head reads the body's features detached, so the body and the generic head learn from the
  balanced softmax alone;
- ``personal_head=separate`` (FL-bench's code): the personal head's logits alone, and its
  cross-entropy trains the body too.

One optimizer over the body, both heads: with ``on_generic`` the two losses reach disjoint
parameters, so one SGD step on their sum is PFLlib's two steps on one batch (its personal step
reads the features computed before the body's step, as here). The personalized predictor is the
one ``test_before`` and ``test_after`` evaluate.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option
from pflower.protocol.role_args import RoleArgs

from ..training import TrainArgs
from .base import Role, RoleContext, train_own

PREFIX = "fedrod.p_head."  # the personal head's tensors in ctx.extra_state
PERSONAL_HEADS = ("on_generic", "separate")


def balanced_softmax_loss(logits: torch.Tensor, y: torch.Tensor, counts: torch.Tensor, gamma: float) -> torch.Tensor:
    """Cross-entropy of ``logits + log(counts ** gamma)``: the balanced softmax of Ren et al. (2020)
    with the client's label counts (``gamma`` 1; FL-bench's ``gamma`` scales the prior). A class the
    client has none of gets a logit of minus infinity for ``gamma > 0``: it is never a target here."""
    return nn.functional.cross_entropy(logits + (counts.to(logits) ** gamma).log(), y)


def label_counts(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """How many training examples of each class the client holds."""
    return torch.bincount(y.long(), minlength=num_classes).float()


class RoDNet(nn.Module):
    """The received model with the client's personal head beside its classifier; its output is the
    personalized prediction (``on_generic``: generic plus personal logits; ``separate``: personal)."""

    def __init__(self, net: nn.Module, p_head: nn.Module, personal_head: str) -> None:
        super().__init__()
        self.net, self.p_head, self.personal_head = net, p_head, personal_head

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(generic logits, personalized logits) of ``x``."""
        z = self.net.features(x)
        generic = self.net.groups[self.net.group_names[-1]](z)
        if self.personal_head == "on_generic":
            return generic, generic.detach() + self.p_head(z.detach())
        return generic, self.p_head(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads(x)[1]


@dataclass(frozen=True)
class FedRoDArgs(RoleArgs):
    """FedRoD's client: the balanced softmax on the generic head, cross-entropy on the personal one."""

    personal_head: str = option(
        "on_generic",
        "on_generic: personalized logits = generic + personal head on detached features (paper, PFLlib); "
        "separate: the personal head alone, its loss training the body too (FL-bench)",
        choices=PERSONAL_HEADS,
    )
    gamma: float = option(1.0, "exponent of the label counts in the balanced softmax (paper: 1)", low=0)


class FedRoDRole(Role):
    """One training loop over the body and both heads (:func:`rod_loss`); the personal head is
    kept between rounds and starts as a copy of the first classifier the client receives."""

    name = "fedrod"
    args_type = FedRoDArgs

    def rod_net(self, model: nn.Module, ctx: RoleContext) -> RoDNet:
        """The received model and this client's personal head (a copy of the received classifier
        on first contact)."""
        head = copy.deepcopy(model.groups[model.group_names[-1]])
        saved = ctx.kept(PREFIX)
        if saved:
            head.load_state_dict(saved)
        return RoDNet(model, head, self.args.personal_head).to(ctx.device)

    def fit_alone(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict:
        net = self.rod_net(model, ctx)
        counts = label_counts(data.y_train, data.num_classes).to(ctx.device)
        gamma = float(self.args.gamma)

        def rod_loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            generic, personal = module.heads(x)
            return balanced_softmax_loss(generic, y, counts, gamma) + nn.functional.cross_entropy(personal, y)

        loss = train_own(net, data, train_args, ctx, loss_fn=rod_loss)
        ctx.keep(PREFIX, net.p_head.state_dict())
        self._trained = net
        return {"train_loss": loss}

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        return self.rod_net(model, ctx)

    def trained_model(self, model: nn.Module, ctx: RoleContext) -> nn.Module:
        trained = getattr(self, "_trained", None)
        return self.rod_net(model, ctx) if trained is None else trained
