"""FedMD's client side (Li and Wang, "FedMD: Heterogenous Federated Learning via Model Distillation",
2019): transfer learning on the labelled set every party holds, then each round digest the
server's consensus on a subset of it and revisit the private data, and send this round's scores.

The consensus targets are per sample of a subset; :func:`client_app.training.train` runs with
the subset's positions as targets (the batches and their order as every role's), and the loss
looks the consensus rows up by position.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option, sent
from pflower.protocol.role_args import RoleArgs, RoleArgsError

from ..training import TrainArgs, train
from .base import Role, RoleContext, train_own

FEDMD = "md/"  # the extra arrays: md/scores up; md/consensus and md/round down
FEDMD_DIGEST_LOSSES = ("l1", "kl")


@dataclass(frozen=True)
class FedMDArgs(RoleArgs):
    """FedMD's client, on the labelled transfer split every party holds (``dataset.transfer_fraction``).
    At its first round it trains ``transfer_epochs`` on that split; whenever the server sends a
    consensus (``md/consensus`` [P, C] and its round ``md/round`` [1]) it first digests it,
    ``digest_epochs`` toward the consensus on that round's subset, then trains on its private data
    and uploads its logits on this round's subset (``md/scores``). A round's subset: ``subset``
    indices of the transfer split drawn from (``seed``, round) alone (:func:`fedmd_subset`), so every
    party draws the same without sending them."""

    subset: int = option(1000, "transfer-split samples scored and digested per round", low=1)
    transfer_epochs: int = option(5, "epochs on the transfer split at a client's first round", low=0)
    digest_epochs: int = option(1, "epochs toward the consensus on its subset per round", low=0)
    digest_loss: str = option("l1", "l1: logits' mean absolute error (FedMD's code) | kl", choices=FEDMD_DIGEST_LOSSES)
    seed: int = sent(0, "the run's seed (each round's subset comes from it)")


def fedmd_subset(seed: int, server_round: int, size: int, population: int) -> list[int]:
    """The transfer-split indices of a round's consensus (sorted), from (seed, round) alone."""
    if size > population:
        raise RoleArgsError(
            f"fedmd subset {size} is larger than the transfer split ({population} samples): lower method.subset or "
            "raise dataset.transfer_fraction"
        )
    rng = np.random.default_rng([int(seed), int(server_round), 6007])
    return sorted(int(i) for i in rng.choice(population, size=size, replace=False))


TRANSFERRED = "fedmd/transferred"  # kept in the client's state: its transfer learning is done


def digest_loss(consensus: torch.Tensor, kind: str):
    """The loss of a batch of subset positions toward the consensus logits: ``l1`` the mean absolute
    error of the logits (FedMD's code), ``kl`` KL(softmax(consensus) ‖ softmax(logits))."""

    def loss(model: nn.Module, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        target = consensus[pos.cpu()].to(logits.device)
        if kind == "l1":
            return F.l1_loss(logits, target)
        return F.kl_div(F.log_softmax(logits, dim=1), F.softmax(target, dim=1), reduction="batchmean")

    return loss


@torch.no_grad()
def scores(model: nn.Module, x: torch.Tensor, device: torch.device, batch_size: int = 256) -> torch.Tensor:
    """The evaluation-mode logits of ``x`` [P, C] (float32, CPU)."""
    was_training = model.training
    model.eval()
    try:
        out = [model(x[s : s + batch_size].to(device)).float().cpu() for s in range(0, len(x), batch_size)]
    finally:
        model.train(was_training)
    return torch.cat(out)


class FedMDRole(Role):
    """Transfer once; then digest, revisit, score."""

    name = "fedmd"
    args_type = FedMDArgs

    def fit(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict[str, float]:
        if ctx.transfer is None:
            raise ValueError(
                "fedmd needs the labelled transfer split every party holds: set dataset.transfer_fraction (e.g. 0.1) "
                "on a dataset every node reads"
            )
        tx, ty = ctx.transfer
        a = self.args
        metrics: dict[str, float] = {}
        if TRANSFERRED not in ctx.extra_state and a.transfer_epochs > 0:
            metrics["transfer_loss"] = train(
                model,
                tx,
                ty,
                replace(train_args, epochs=a.transfer_epochs, steps=None, optimizer_state="fresh"),
                generator=ctx.generator,
                device=ctx.device,
            )
        ctx.extra_state[TRANSFERRED] = torch.ones(1)
        consensus = ctx.received_extra.get(FEDMD + "consensus")
        if consensus is not None and a.digest_epochs > 0:
            done = int(ctx.received_extra[FEDMD + "round"].reshape(-1)[0])
            subset = torch.as_tensor(fedmd_subset(a.seed, done, a.subset, len(ty)))
            # The class count from the data, not a forward pass: one in train mode would move BN statistics.
            if tuple(consensus.shape) != (len(subset), data.num_classes):
                raise ValueError(
                    f"fedmd: the server's consensus has shape {tuple(consensus.shape)}, expected "
                    f"({len(subset)}, {data.num_classes}) (subset x classes): server and client disagree on "
                    "method.subset or the dataset"
                )
            metrics["digest_loss"] = train(
                model,
                tx[subset],
                torch.arange(len(subset)),
                replace(train_args, epochs=a.digest_epochs, steps=None, optimizer_state="fresh"),
                loss_fn=digest_loss(consensus.float(), a.digest_loss),
                generator=ctx.generator,
                device=ctx.device,
            )
        metrics["train_loss"] = train_own(model, data, train_args, ctx)
        mine = torch.as_tensor(fedmd_subset(a.seed, ctx.server_round, a.subset, len(ty)))
        ctx.upload_extra[FEDMD + "scores"] = scores(model, tx[mine], ctx.device)
        return metrics
