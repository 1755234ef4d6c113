"""A ClientApp's own model and data in place of the ones the server's spec names.

:func:`~pflower.client_app.build_clientapp` puts a user's model factory and data function here;
the runtime asks :class:`ClientHooks` instead of the registry and the partitioner. Both are
called once per process (and client), then copied or reused, as the built-in paths are.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import Context
from torch import nn

from pflower.federated_data import ClientData
from pflower.federated_data.datasets import DataHookError, check_labels, user_splits
from pflower.federated_data.tensors import to_unit
from pflower.models import LayeredNet, adapt
from pflower.protocol.targets import call_with
from pflower.protocol.wire import TaskSpec

ModelFn = Callable[..., nn.Module]
DataFn = Callable[..., Any]


@dataclass
class ClientHooks:
    """``model``: returns the user's module (called with ``in_shape`` / ``num_classes`` where its
    signature names them), seeded with the run's seed so every client starts from the same
    weights; ``data``: returns the client's ``(train, test)`` datasets (called with ``context``,
    ``client_id`` and ``num_clients`` where its signature names them); ``groups``: the layer
    groups where the module's top-level children are not the right ones; ``num_classes``: the
    class count where the labels do not show it (default: the largest label + 1)."""

    model: ModelFn
    data: DataFn
    groups: Mapping[str, Sequence[str] | str] | None = None
    num_classes: int | None = None
    _models: dict[tuple[int, tuple[int, ...]], LayeredNet] = field(default_factory=dict, repr=False)
    _data: dict[int, ClientData] = field(default_factory=dict, repr=False)

    def model_of(self, spec: TaskSpec, in_shape: tuple[int, ...]) -> LayeredNet:
        """A fresh copy of the initial model (built once per process and seed)."""
        key = (int(spec.seed), tuple(in_shape))
        if key not in self._models:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(spec.seed))
                module = call_with(self.model, {"in_shape": tuple(in_shape), "num_classes": self.num_classes}, {})
            self._models[key] = adapt(module, self.groups, in_shape)
        return copy.deepcopy(self._models[key])

    def data_of(self, context: Context, client_id: int) -> ClientData:
        """This client's tensors (loaded once per process and client)."""
        if client_id not in self._data:
            offered = {
                "context": context,
                "client_id": client_id,
                "num_clients": int(context.node_config.get("num-partitions", 0)) or None,
            }
            where = f"data function {getattr(self.data, '__qualname__', self.data)!r}"
            splits = user_splits(call_data(self.data, offered), where)
            if set(splits) != {"train", "test"}:
                raise DataHookError(f"{where} must return (train, test) or {{'train': ..., 'test': ...}}")
            (x_train, y_train), (x_test, y_test) = splits["train"], splits["test"]
            num_classes = self.num_classes or int(max(y_train.max(), y_test.max() if len(y_test) else 0)) + 1
            for name, y in (("train", y_train), ("test", y_test)):
                check_labels(y, num_classes, f"{where} {name}")
            self._data[client_id] = ClientData(
                client_id=client_id,
                x_train=_tensor(x_train),
                y_train=torch.from_numpy(y_train),
                x_test=_tensor(x_test),
                y_test=torch.from_numpy(y_test),
                num_classes=num_classes,
                extra={"meta": {"name": where}},
            )
        return self._data[client_id]


def _tensor(images: np.ndarray) -> torch.Tensor:
    """The user's images as they are (their own transforms applied); uint8 scaled to [0, 1]."""
    return torch.from_numpy(np.ascontiguousarray(to_unit(images)))


def call_data(function: DataFn, offered: Mapping[str, Any]) -> Any:
    """Call a data function: with the offered values its signature names (``context``,
    ``client_id``, ``num_clients``), or, where its one required parameter has another name
    (``lambda c: load(c.node_config[...])``), with the context as that argument."""
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        params = []
    required = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(required) == 1 and required[0].name not in offered:
        return function(offered["context"])
    return call_with(function, offered, {})
