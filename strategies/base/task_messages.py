"""What one message to a client holds: its task spec (read from the method's hooks) and arrays."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from pflower.client_app.roles import ROLES
from pflower.models import group_of
from pflower.models.schema import ModelSchema, Template
from pflower.protocol import wire
from pflower.protocol.options import MethodOptions
from pflower.protocol.role_args import RoleArgs
from pflower.protocol.wire import WIRE_EXTRA_PREFIX, TaskSpec

from .architectures import Architectures
from .hooks import MethodTraits, Uplink
from .run_context import RunContext


class Messenger(Protocol):
    """What the message builder reads from the strategy (its hooks, schemas and client spec)."""

    traits: MethodTraits
    final_global_test: bool
    run: RunContext
    model: Architectures

    def train_config(self, client_id: int, server_round: int) -> dict[str, Any]: ...

    options: MethodOptions

    def role_config(self, client_id: int, server_round: int) -> Mapping[str, Any]: ...
    def personal_groups(self, client_id: int, server_round: int) -> list[str]: ...
    def personal_keys(self, client_id: int, server_round: int) -> list[str]: ...
    def uplink(self, client_id: int, server_round: int) -> Uplink: ...


def role_args(s: Messenger, client_id: int, server_round: int) -> RoleArgs:
    """The arguments one message's role receives: the method's options that the role declares
    (the method's options dataclass extends the role's arguments; a role option the method lacks
    keeps its default), with :meth:`role_config`'s values for this client and round. Built, and so
    checked, before the message is sent."""
    args_type = ROLES[s.traits.role].args_type
    options = s.options.to_dict()
    declared = {name: options[name] for name in args_type.names() if name in options}
    return args_type(**{**declared, **s.role_config(client_id, server_round)})


def task_spec(s: Messenger, client_id: int, server_round: int, task: str) -> TaskSpec:
    """What one message asks of its client (see :class:`protocol.wire.TaskSpec`)."""
    schema = s.model.schema(client_id)
    base = s.run.client_spec
    return TaskSpec(
        run=str(base.get("run", "")),
        seed=int(base.get("seed", 0)),
        model=dict(schema.spec),
        arch=schema.arch,
        data=dict(base.get("data", {})),
        train=s.train_config(client_id, server_round),
        task=task,
        role=s.traits.role,
        role_args=role_args(s, client_id, server_round).wire() if task != "query" else {},
        personal=list(s.personal_groups(client_id, server_round)) if task != "query" else [],
        personal_keys=list(s.personal_keys(client_id, server_round)) if task != "query" else [],
        upload=list(s.uplink(client_id, server_round).groups) if task == "train" else [],
        keep=s.traits.client_keeps,
        shared_buffers=s.traits.shared_buffers,
        device=str(base.get("device", "auto")),
        deterministic=bool(base.get("deterministic", False)),
        client_state_dir=base.get("client_state_dir"),
        state_versions=int(base.get("state_versions", 1)),
        global_test=task == "evaluate" and s.final_global_test,
    )


def hello_spec(client_spec: Mapping[str, Any], schema: ModelSchema) -> TaskSpec:
    """The discovery query every node answers (its client id, state, announced model)."""
    return TaskSpec(
        run=str(client_spec.get("run", "")),
        seed=int(client_spec.get("seed", 0)),
        model=dict(schema.spec),
        arch=schema.arch,
        data=dict(client_spec.get("data", {})),
        train=dict(client_spec.get("train", {})),
        task="query",
        client_state_dir=client_spec.get("client_state_dir"),
    )


def task_message(
    spec: TaskSpec,
    client_id: int,
    server_round: int,
    message_type: str,
    node_id: int,
    ttl: float | None,
    down: Mapping[str, np.ndarray],
    extra: Mapping[str, np.ndarray],
    template: Template,
    plain: Mapping[str, Any] | None = None,
) -> tuple[Message, ArrayRecord, set[str]]:
    """The message, its array record (for the byte count) and the layer groups it carries.
    ``plain``: config keys for a ClientApp of the user's own (lr, local-epochs, ...)."""
    arrays = ArrayRecord(array_dict={k: Array(np.ascontiguousarray(v)) for k, v in down.items()})
    for k, v in extra.items():
        arrays[WIRE_EXTRA_PREFIX + k] = Array(np.ascontiguousarray(v))
    groups = {group_of(k) for k in down} | {
        group_of(k.split("/", 1)[-1]) for k in extra if k.split("/", 1)[-1] in template
    }
    config = ConfigRecord(
        {**(plain or {}), wire.ROUND_KEY: server_round, wire.CLIENT_KEY: client_id, wire.SPEC_KEY: spec.to_json()}
    )
    content = RecordDict({wire.ARRAYS_RECORD: arrays, wire.CONFIG_RECORD: config})
    return Message(content=content, message_type=message_type, dst_node_id=node_id, ttl=ttl), arrays, groups
