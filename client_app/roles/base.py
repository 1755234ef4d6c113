"""The plain SGD role (FedAvg, FedPer, Local) and the interface every role implements."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from pflower.federated_data import ClientData
from pflower.protocol.roles import RoleArgs, SGDArgs

from ..training import TrainArgs, train


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


# every client role, by name: a Role subclass defined in this package with its own ``name`` joins it
ROLES: dict[str, type[Role]] = {}


class Role:
    """A method's client side. Subclasses override only what differs from plain SGD.

    ``args_type``: the role's arguments (a :mod:`protocol.roles` dataclass, shared with its
    strategy); ``self.args`` is an instance, parsed and checked from the message. A subclass
    with its own ``name`` in ``client_app/roles/`` registers itself (no list to edit).
    """

    name = "base"
    args_type: type[RoleArgs] = SGDArgs

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__ and cls.__module__.startswith("pflower.client_app.roles."):
            known = ROLES.get(cls.name)
            if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
                raise TypeError(f"client role {cls.name!r} is taken by {known.__module__}.{known.__qualname__}")
            ROLES[cls.name] = cls

    def __init__(self, args: Mapping[str, Any] | RoleArgs | None = None) -> None:
        self.args: Any = args if isinstance(args, self.args_type) else self.args_type.from_dict(dict(args or {}))

    def fit(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict[str, float]:
        """Local training; returns scalar metrics (at least ``train_loss``)."""
        raise NotImplementedError

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        """The model this client would use now (``test_before``); by default the received one."""
        return model

    def trained_model(self, model: nn.Module, ctx: RoleContext) -> nn.Module:
        """The model ``test_after`` evaluates; by default the one just trained (Ditto: its personal one)."""
        return model


class SGDRole(Role):
    """E epochs of SGD on all parameters; optional fine-tuning of a copy before evaluation."""

    name = "sgd"

    def fit(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> dict[str, float]:
        loss = train(model, data.x_train, data.y_train, train_args, generator=ctx.generator, device=ctx.device)
        return {"train_loss": loss}

    def eval_model(self, model: nn.Module, data: ClientData, train_args: TrainArgs, ctx: RoleContext) -> nn.Module:
        epochs = int(self.args.finetune_epochs)
        if epochs <= 0:
            return model
        tuned = copy.deepcopy(model)
        train(
            tuned,
            data.x_train,
            data.y_train,
            replace(train_args, epochs=epochs, steps=None),
            params=self.finetune_params(tuned, ctx),
            generator=ctx.generator,
            device=ctx.device,
        )
        return tuned

    def finetune_params(self, model: nn.Module, ctx: RoleContext) -> list[nn.Parameter] | None:
        """Parameters the pre-evaluation fine-tuning updates (None: all; FedBabu may pick the head)."""
        return None
