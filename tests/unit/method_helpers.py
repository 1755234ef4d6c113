"""Helpers the per-method test files share (hand-built role contexts, tensors of a group, states of a grid)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from pflower.client_app.roles import RoleContext
from pflower.simulation.inprocess import InProcessGrid, personal_state

HEAD = ["classifier"]


BODY = ["conv1", "conv2", "fc1", "fc2"]


def ctx(personal=(), extra=None) -> RoleContext:
    return RoleContext(torch.device("cpu"), torch.Generator().manual_seed(0), 1, list(personal), dict(extra or {}))


def params(model: nn.Module, groups) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in model.named_parameters() if k.split(".")[1] in groups}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def replied_keys(grid) -> list[set[str]]:
    return [set(r.content.array_records["arrays"].keys()) for r in grid.replies if r.metadata.message_type == "train"]


def trained_states(grid: InProcessGrid) -> dict[int, dict[str, np.ndarray]]:
    """Each client's persisted state, by client id (clients that trained at least once)."""
    out = {}
    for node, c in grid.contexts.items():
        state = personal_state(c)
        if state is not None:
            out[int(c.node_config["partition-id"])] = state
    return out


def train_messages(grid: InProcessGrid, server_round: int):
    return [
        m
        for m in grid.sent
        if m.metadata.message_type == "train" and int(m.content["config"]["server-round"]) == server_round
    ]


def role_args_of(method: str, **given) -> dict:
    """A role's arguments as a message of ``method`` carries them at its default options (every
    field: the client refuses a message without one), with ``given`` on top."""
    import dataclasses

    from pflower.client_app.roles import ROLES
    from pflower.strategies import STRATEGIES

    cls = STRATEGIES[method]
    every = {  # not built here: a test hands a bad value on to the role's own check
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(ROLES[cls.traits.role].args_type)
    }
    options = {k: v for k, v in cls.options_type.defaults().items() if k in every}
    return {**every, **options, **given}
