"""The plain SGD role (FedAvg, FedPer, Local) and the interface every role implements."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.options import option
from pflower.protocol.role_args import RoleArgs

from ..training import LossFn, TrainArgs, cross_entropy, train

# a term added to every batch's loss, as a function of the trained parameters (by name) and the
# client's reference tensors: written once, it serves a module's own parameters (one client at a
# time) and one client's slice of stacked parameters (the batched engine, under torch.func.vmap)
Penalty = Callable[[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]], torch.Tensor]


@dataclass
class RoleContext:
    """What a role may use besides the model and the data."""

    device: torch.device
    generator: torch.Generator
    server_round: int
    personal: list[str]
    extra_state: dict[str, torch.Tensor] = field(default_factory=dict)  # role tensors kept between rounds
    personal_keys: list[str] = field(default_factory=list)  # single keys of shared groups kept here (FedBN)
    # arrays besides model tensors, keyed "<name>/<key>" (on the wire "extra/<name>/<key>"):
    received_extra: dict[str, torch.Tensor] = field(
        default_factory=dict
    )  # sent by the server (FedFomo: others' models)
    upload_extra: dict[str, torch.Tensor] = field(default_factory=dict)  # sent back; the server validates them (FedAP)
    # the model keys this reply uploads: the most the server asked for; a role may choose fewer, as
    # long as the set is one the strategy declared (uplink_sets: BLS's layer prefixes)
    upload_keys: list[str] = field(default_factory=list)
    # the labelled transfer split every party holds (dataset.transfer_fraction > 0; FedMD's public
    # set): normalized images and labels, None without one
    transfer: tuple[torch.Tensor, torch.Tensor] | None = None

    def kept(self, prefix: str) -> dict[str, torch.Tensor]:
        """The tensors a role kept under ``prefix`` in :attr:`extra_state`, the prefix removed
        (empty on the client's first contact)."""
        return {k[len(prefix) :]: t for k, t in self.extra_state.items() if k.startswith(prefix)}

    def keep(self, prefix: str, tensors: Mapping[str, torch.Tensor]) -> None:
        """Keep ``tensors`` (a module's state dict) under ``prefix`` for the client's next round (CPU copies)."""
        self.extra_state.update({prefix + k: t.detach().cpu().clone() for k, t in tensors.items()})


@dataclass
class FitPlan:
    """A role's local training as data: mini-batch SGD (:func:`client_app.training.train`) on the
    client's cross-entropy plus ``penalty(params, reference)`` (or several penalties, added in
    order), updating ``params`` (names; None: every trainable parameter) of ``model`` (None: the
    received model; Ditto: its personal copy) for ``epochs`` (None: the round's), then
    ``after(model)`` for metrics computed on the trained model. A round may be several plans run
    one after another (stages: FedRep's head then body, Ditto's personal model then the global
    one); each stage's mean loss is reported as ``loss_name`` (:func:`stage_metrics`).
    One plan runs one client (:func:`run_plan`) or many clients at once (``client_app.grouped_training``),
    so the two engines share one definition of the role."""

    params: list[str] | None = None
    penalty: Penalty | tuple[Penalty, ...] | None = None
    reference: dict[str, torch.Tensor] = field(default_factory=dict)
    after: Callable[[nn.Module], dict[str, float]] | None = None
    model: nn.Module | None = None
    epochs: int | None = None
    loss_name: str = "train_loss"

    def penalties(self) -> tuple[Penalty, ...]:
        if self.penalty is None:
            return ()
        return self.penalty if isinstance(self.penalty, tuple) else (self.penalty,)

    def loss_fn(self) -> LossFn:
        """The per-batch loss of one client's module."""
        penalties, reference = self.penalties(), self.reference
        if not penalties:
            return cross_entropy

        def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            total = cross_entropy(model, x, y)
            params = dict(model.named_parameters())
            for penalty in penalties:  # left to right: ((CE + p1) + p2), the same sum on both engines
                total = total + penalty(params, reference)
            return total

        return loss

    def train_args(self, args: TrainArgs) -> TrainArgs:
        """The round's arguments with this stage's epoch count (a whole number of epochs)."""
        return args if self.epochs is None else replace(args, epochs=int(self.epochs), steps=None)


Plans = FitPlan | Sequence[FitPlan]


def stages(plan: Plans) -> list[FitPlan]:
    """A round's plans in the order they train."""
    return [plan] if isinstance(plan, FitPlan) else list(plan)


def stage_metrics(plans: Sequence[FitPlan], losses: Sequence[float]) -> dict[str, float]:
    """Each stage's mean loss under its ``loss_name`` where it trained (a stage of 0 epochs has
    NaN and reports nothing), and ``train_loss`` always: the stage named so (as it came), else
    the last stage that trained (0.0 when none did)."""
    out = {p.loss_name: loss for p, loss in zip(plans, losses) if math.isfinite(loss) and p.loss_name != "train_loss"}
    named = [loss for p, loss in zip(plans, losses) if p.loss_name == "train_loss"]
    finite = [loss for loss in losses if math.isfinite(loss)]
    out["train_loss"] = named[-1] if named else (finite[-1] if finite else 0.0)
    return out


def train_stage(stage: FitPlan, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> float:
    """One client's training by one stage (``model``: the received one); its mean batch loss."""
    module = model if stage.model is None else stage.model
    params = None
    if stage.params is not None:
        wanted = set(stage.params)
        params = [p for name, p in module.named_parameters() if name in wanted]
    return train(
        module,
        data.x_train,
        data.y_train,
        stage.train_args(train_args),
        params=params,
        loss_fn=stage.loss_fn(),
        generator=ctx.generator,
        device=ctx.device,
        kept=ctx.extra_state,
        slot=stage.loss_name,  # a stage's own optimizer (optimizer_state=kept): Ditto's two models differ
    )


def train_own(
    model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext, loss_fn: LossFn = cross_entropy
) -> float:
    """A role's own training loop over the client's training split (a role that is not a
    :class:`FitPlan`): :func:`~client_app.training.train` with the client's generator, device and
    kept optimizer state (``optimizer_state=kept``); the mean batch loss."""
    return train(
        model,
        data.x_train,
        data.y_train,
        train_args,
        loss_fn=loss_fn,
        generator=ctx.generator,
        device=ctx.device,
        kept=ctx.extra_state,
    )


def check_plain_sgd(args: TrainArgs, method: str) -> None:
    """A method whose steps are its paper's plain gradient steps (Per-FedAvg, pFedMe) refuses
    another optimizer, with the fix."""
    if args.optimizer != "sgd" or args.momentum or args.weight_decay or args.optimizer_state != "fresh":
        raise ValueError(
            f"{method}'s steps are plain gradient steps (the paper's): run it with optimizer=sgd, "
            f"momentum=0, weight_decay=0, optimizer_state=fresh (got {args.optimizer}, momentum {args.momentum}, "
            f"weight_decay {args.weight_decay}, {args.optimizer_state})"
        )


def finish_stages(plans: Sequence[FitPlan], losses: Sequence[float], model: nn.Module) -> dict[str, float]:
    """The metrics of a client's trained stages: their losses, then each ``after`` in order."""
    metrics = stage_metrics(plans, losses)
    for stage in plans:
        if stage.after is not None:
            metrics.update(stage.after(model if stage.model is None else stage.model))
    return metrics


def run_plan(plan: Plans, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict:
    """One client's training by ``plan``, stage by stage (the per-client engines' path)."""
    plans = stages(plan)
    return finish_stages(plans, [train_stage(s, model, data, train_args, ctx) for s in plans], model)


@dataclass(frozen=True)
class SGDArgs(RoleArgs):
    """Plain SGD's arguments (FedAvg, FedPer, Local...): ``finetune_epochs > 0`` fine-tunes a copy
    before every evaluation (FedAvg-FT). A method whose options do not extend this class sends 0."""

    finetune_epochs: int = option(
        0, "epochs of fine-tuning a copy of the received model before test_before (FedAvg-FT)", low=0
    )


# every client role, by name: a Role subclass defined in this package with its own ``name`` joins it
ROLES: dict[str, type[Role]] = {}


class Role:
    """A method's client side. Subclasses override only what differs from plain SGD.

    ``args_type``: the role's arguments (a :class:`~pflower.protocol.role_args.RoleArgs` declared
    beside the role; the method's options extend it); ``self.args`` is an instance, decoded and
    checked from the message. A subclass
    with its own ``name`` in ``client_app/roles/`` registers itself (no list to edit).
    """

    name = "base"
    args_type: type[RoleArgs] = RoleArgs

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__ and cls.__module__.startswith("pflower.client_app.roles."):
            known = ROLES.get(cls.name)
            if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
                raise TypeError(f"client role {cls.name!r} is taken by {known.__module__}.{known.__qualname__}")
            ROLES[cls.name] = cls

    def __init__(self, args: Mapping[str, Any] | RoleArgs | None = None) -> None:
        self.args: Any = args if isinstance(args, self.args_type) else self.args_type.from_wire(args, self.name)

    def fit(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict[str, float]:
        """Local training; returns scalar metrics (at least ``train_loss``): by this round's
        :meth:`plan`, else :meth:`fit_alone`. A role that overrides this (rather than the two)
        always runs one client at a time."""
        plan = self.plan(model, data, train_args, ctx)
        if plan is None:
            return self.fit_alone(model, data, train_args, ctx)
        return run_plan(plan, model, data, train_args, ctx)

    def fit_alone(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict:
        """Training that is not a :class:`FitPlan` (e.g. FedCMD's votes taken on every batch)."""
        raise NotImplementedError(f"role {self.name!r} defines none of fit, plan, fit_alone")

    def plan(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> Plans | None:
        """This round's training as a :class:`FitPlan` (or several, trained in order), or None
        where it is not one (then
        :meth:`fit_alone` runs, and the batched engine trains such a client on its own)."""
        return None

    def trains(self, model: nn.Module, ctx: RoleContext) -> bool:
        """Whether this round trains the model at all (FedCPMD's vote-only probe does not): a
        ClientApp's own train function (``client_mod``) is called only for a round that does."""
        return True

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        """The model this client would use now (``test_before``); by default the received one."""
        return model

    def trained_model(self, model: nn.Module, ctx: RoleContext) -> nn.Module:
        """The model ``test_after`` evaluates; by default the one just trained (Ditto: its personal one)."""
        return model


class SGDRole(Role):
    """E epochs of SGD on all parameters; optional fine-tuning of a copy before evaluation."""

    name = "sgd"
    args_type: type[RoleArgs] = SGDArgs

    def plan(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> FitPlan | None:
        return FitPlan()

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        epochs = int(self.args.finetune_epochs)
        if epochs <= 0:
            return model
        tuned = copy.deepcopy(model)
        train(
            tuned,
            data.x_train,
            data.y_train,
            # an evaluation copy's fine-tune: its optimizer is not the client's kept one
            replace(train_args, epochs=epochs, steps=None, optimizer_state="fresh"),
            params=self.finetune_params(tuned, ctx),
            generator=ctx.generator,
            device=ctx.device,
        )
        return tuned

    def finetune_params(self, model: nn.Module, ctx: RoleContext) -> list[nn.Parameter] | None:
        """Parameters the pre-evaluation fine-tuning updates (None: all; FedBabu may pick the head)."""
        return None
