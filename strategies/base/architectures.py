"""The federation's model(s): ``self.model`` of a strategy, one part the strategy base holds.

The server keeps a :class:`models.schema.ModelSchema` and global arrays per architecture and
looks a client's up by its client id; a homogeneous run is the one-architecture case. Which
client runs which model comes from the config's assignment rule, and a deployed node may
announce its own (node config ``model``): :meth:`Architectures.take_announced` checks that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from logging import INFO
from typing import Any

import numpy as np
from flwr.common import log
from torch import nn

from pflower.models import LayeredNet, adapt
from pflower.models.adapter import check_logits, reseeded
from pflower.models.schema import ModelSchema, Template, assign_archs, initial_arrays


class Architectures:
    """Schemas, global arrays and the client -> architecture map of one run (a method's
    ``self.model``): ``keys(groups, client_id)`` names the tensors that travel,
    ``global_arrays`` is the one global model of a homogeneous run, ``arrays[arch]`` each
    architecture's, ``arch_of[client_id]`` who runs which."""

    def __init__(
        self,
        model: nn.Module | Mapping[str, nn.Module],
        spec: dict[str, Any],
        num_clients: int,
        *,
        method: str,
        heterogeneous: bool,
        shared_buffers: bool,
        seed: int | None = None,
    ) -> None:
        """``spec``: the client spec; its ``archs`` and ``assign`` entries are taken out of it.
        ``seed``: a user's module (not a pflower model, which is built seeded) starts from weights
        drawn from it (:func:`models.adapter.reseeded`), so two runs of one app start alike."""
        arch_specs = spec.pop("archs", None)
        rule = spec.pop("assign", None) or "blocks"

        def own(module: nn.Module) -> LayeredNet:
            if isinstance(module, LayeredNet):
                return module
            # a user's module: its top-level children are the layer groups, its weights drawn from seed
            return adapt(module if seed is None else reseeded(module, seed))

        if isinstance(model, nn.Module):
            model = own(model)
        elif isinstance(model, Mapping):
            model = {arch: own(m) for arch, m in model.items()}
        for net in [model] if isinstance(model, nn.Module) else model.values():
            check_logits(net)  # a softmax after the last group: not the logits the clients' loss needs
        if isinstance(model, LayeredNet):
            model_spec = dict(spec.get("model") or {"name": "model"})
            models = {str(model_spec.get("name", "model")): model}
            arch_specs = {next(iter(models)): model_spec}
        else:
            models = dict(model)
            if not models:
                raise ValueError("a federation needs at least one architecture")
            arch_specs = dict(arch_specs or {})
            missing = sorted(set(models) - set(arch_specs))
            if missing:
                raise ValueError(f"client_spec['archs'] lacks the model spec of architecture(s) {missing}")
        if len(models) > 1 and not heterogeneous:
            raise ValueError(
                f"method {method!r} runs one architecture on every client, but the config names {sorted(models)}: "
                "use a method for heterogeneous clients (fedavg averages each architecture apart, felo, velo, fedhe, "
                "local)"
            )
        self.shared_buffers = shared_buffers
        self.schemas = {arch: ModelSchema.of(m, arch, arch_specs[arch]) for arch, m in models.items()}
        self.default = next(iter(self.schemas))
        # the architecture whose arrays are the run's result (Flower's ``Result.arrays``,
        # ``evaluate_fn``): the first; HeteroFL sets its widest level
        self.global_arch = self.default
        self.method = method
        self.arch_of: dict[int, str] = assign_archs(rule, list(self.schemas), num_clients)
        self.announced: dict[int, str] = {}  # client id -> the architecture its node announced
        self.arrays: dict[str, dict[str, np.ndarray]] = {
            arch: initial_arrays(m, self.schemas[arch].keys(buffers=shared_buffers)) for arch, m in models.items()
        }

    def set_initial(self, arrays: Mapping[str, Any]) -> None:
        """Flower's ``initial_arrays`` (an ArrayRecord) as the default architecture's starting
        values, under the model's own names (``ArrayRecord(Net().state_dict())``) or pflower's
        (``groups.<group>.<key>``). A tensor the model does not hold, or of another shape, is
        refused naming it; one that never travels (an integer buffer) is left out."""
        from .client_spec import SetupError

        schema = self.schemas[self.default]
        ours = {own: key for key, own in schema.own_names.items()} | {key: key for key in schema.own_names}
        travels = schema.keys(buffers=self.shared_buffers)
        for name, array in arrays.items():
            key = ours.get(name)
            if key is None:
                raise SetupError(
                    f"initial_arrays holds {name!r}, which the model does not have (its keys: "
                    f"{sorted(schema.own_names.values())[:6]}...): pass ArrayRecord(model.state_dict()) of the "
                    "model given to the strategy"
                )
            if key not in travels:
                continue
            value = array.numpy()
            shape = schema.template[key][0]
            if tuple(value.shape) != shape:
                raise SetupError(
                    f"initial_arrays[{name!r}] has shape {list(value.shape)}; the model's is {list(shape)}"
                )
            self.arrays[self.default][key] = value.astype(schema.template[key][1], copy=True)

    def own_names(self, arrays: Mapping[str, Any], arch: str | None = None) -> dict[str, Any]:
        """``arrays`` of ``arch`` (default: the default architecture) under the model's own
        state-dict names (what a Flower user's ``Net().load_state_dict`` reads: Flower's
        ``Result.arrays``, ``evaluate_fn``)."""
        names = self.schemas[arch or self.default].own_names
        return {names.get(key, key): value for key, value in arrays.items()}

    def result_arrays(self) -> dict[str, np.ndarray]:
        """The run's result: :attr:`global_arch`'s arrays under the model's own names."""
        return self.own_names(self.arrays[self.global_arch], self.global_arch)

    def schema(self, client_id: int | None = None) -> ModelSchema:
        """The model schema of ``client_id`` (the default architecture's if None)."""
        return self.schemas[self.default if client_id is None else self.arch_of[client_id]]

    def keys(self, groups: Iterable[str] | None = None, client_id: int | None = None) -> list[str]:
        """Keys of ``groups`` (default all) that belong to the model on the wire (trainable
        tensors, and float buffers with ``traits.shared_buffers``), in forward order, in
        ``client_id``'s architecture."""
        return self.schema(client_id).keys(groups, buffers=self.shared_buffers)

    @property
    def groups(self) -> list[str]:
        """Layer groups of the default architecture, in forward order."""
        return list(self.schema().groups)

    def arrays_of(self, client_id: int) -> dict[str, np.ndarray]:
        """The global arrays of ``client_id``'s architecture."""
        return self.arrays[self.arch_of[client_id]]

    @property
    def global_arrays(self) -> dict[str, np.ndarray]:
        """The global model of a homogeneous run (every travelling tensor, by key)."""
        return self.arrays[self.single(self.method)]

    @global_arrays.setter
    def global_arrays(self, value: dict[str, np.ndarray]) -> None:
        self.arrays[self.single(self.method)] = value

    @property
    def template(self) -> Template:
        """Shape and dtype of every tensor of the default architecture that may travel."""
        return self.template_of(None)

    def single(self, who: str) -> str:
        """The one architecture of a homogeneous run (``who`` asked for the one global model)."""
        if len(self.schemas) > 1:
            raise AttributeError(
                f"{who} asked for the one global model, but this federation runs {sorted(self.schemas)}: "
                "use self.model.arrays[arch] / self.model.arrays_of(client_id)"
            )
        return self.default

    def template_of(self, client_id: int | None) -> Template:
        """Shape and dtype of every tensor of ``client_id``'s architecture that may travel."""
        return self.template_of_arch(self.schema(client_id).arch)

    def template_of_arch(self, arch: str) -> Template:
        """Shape and dtype of every tensor of architecture ``arch`` that may travel."""
        schema = self.schemas[arch]
        return {k: schema.template[k] for k in schema.keys(buffers=self.shared_buffers)}

    def ordered_groups(self, groups: Iterable[str]) -> list[str]:
        """``groups`` in forward order (of the first architecture that has each)."""
        order = [g for s in self.schemas.values() for g in s.groups]
        return sorted(groups, key=order.index)

    def per_arch(
        self,
        client_ids: Sequence[int],
        metrics: Sequence[Mapping[str, float]],
        summarize: Callable[[list[Mapping[str, float]]], dict[str, float]],
    ) -> dict[str, float]:
        """``summarize`` of each architecture's clients' metrics, as ``<key>@<arch>`` (heterogeneous runs only)."""
        if len(self.schemas) == 1:
            return {}
        out: dict[str, float] = {}
        for arch in self.schemas:
            ms = [m for c, m in zip(client_ids, metrics) if self.arch_of[c] == arch]
            if ms:
                out.update({f"{k}@{arch}": v for k, v in summarize(ms).items()})
        return out

    def counts(self) -> dict[str, int]:
        """Clients per architecture."""
        return {a: sum(1 for v in self.arch_of.values() if v == a) for a in self.schemas}

    def take_announced(self, client_id: int, announced: str | None) -> str | None:
        """Take the architecture a node announced (node config ``model``); the refusal reason, if any."""
        if announced is None:
            return None
        if announced not in self.schemas:
            return (
                f"client {client_id} runs model {announced!r} (its node config), but this run's architectures are "
                f"{sorted(self.schemas)}: set the node's model to one of them, or add it to model.archs"
            )
        before = self.announced.get(client_id)
        if before is not None and before != announced:
            return (
                f"client {client_id} ran {before!r} earlier in this run and now announces {announced!r}: "
                "one client, one model"
            )
        if self.arch_of.get(client_id) != announced:
            log(
                INFO,
                "client %d runs %s (announced by its node; the config's rule gave %s)",
                client_id,
                announced,
                self.arch_of.get(client_id),
            )
        self.announced[client_id] = announced
        self.arch_of[client_id] = announced
        return None

    # ------------------------------------------------------------------ checkpoint
    def state(self) -> dict[str, Any]:
        """The part of the strategy's checkpoint that is this one's (keys as the format has them)."""
        return {
            "global_arrays": self.arrays[self.default],
            # heterogeneous runs: the other architectures' global arrays, and who runs which
            "arch_arrays": {a: v for a, v in self.arrays.items() if a != self.default},
            "arch_of": {str(c): a for c, a in sorted(self.arch_of.items())},
            "announced": {str(c): a for c, a in sorted(self.announced.items())},
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state`; arrays that do not fit the models are refused."""
        saved = {self.default: state["global_arrays"], **dict(state.get("arch_arrays") or {})}
        if set(saved) != set(self.schemas):
            raise ValueError(
                f"the checkpoint holds architectures {sorted(saved)}, this run {sorted(self.schemas)}: was the model "
                "changed?"
            )
        restored = {}
        for arch, arrays in saved.items():
            template = {k: spec for k, spec in self.schemas[arch].template.items() if k in self.arrays[arch]}
            bad = sorted(set(arrays) ^ set(template)) + sorted(
                k
                for k in set(arrays) & set(template)
                if (np.shape(arrays[k]), np.asarray(arrays[k]).dtype) != template[k]
            )
            if bad:
                raise ValueError(
                    f"the checkpoint's global arrays do not fit the model {arch} (keys {bad[:5]}): was the model "
                    "changed?"
                )
            restored[arch] = {k: np.array(arrays[k], copy=True) for k in template}
        self.arrays = restored
        self.arch_of.update({int(c): str(a) for c, a in (state.get("arch_of") or {}).items()})
        self.announced = {int(c): str(a) for c, a in (state.get("announced") or {}).items()}


def check_linear_head(method: str, schemas: Mapping[str, ModelSchema]) -> None:
    """Refuse a model whose last layer group does not end in a linear layer (its last weight
    [classes, features]) for a method that reads that group as its classifier: a Conv2d there
    gives no logits to classify with."""
    from .client_spec import SetupError

    for arch, schema in schemas.items():
        last = schema.group_keys[schema.groups[-1]]
        weights = [k for k in last if len(schema.template[k][0]) >= 2]
        if not weights or len(schema.template[weights[-1]][0]) != 2:
            shapes = {k: list(schema.template[k][0]) for k in last}
            raise SetupError(
                f"method {method!r} reads the model's last layer group as its classifier, which must end in an "
                f"nn.Linear (weight [classes, features]); {arch!r}'s last group {schema.groups[-1]!r} holds {shapes}: "
                "end the model with an nn.Linear (adapt(model, groups=...) names the groups)"
            )
