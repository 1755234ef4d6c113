"""HeteroFL (Diao, Ding, Tarokh: "HeteroFL: Computation and Communication Efficient Federated
Learning for Heterogeneous Clients", ICLR 2021; docs/methods/heterofl.md): clients of different
capability train width-scaled sub-models of one global model.

The federation's architectures are the width levels of one model (``conf/model/lenet5_widths.yaml``:
LeNet-5 at rates 1, 1/2, 1/4 with the paper's scalers); the widest is the global model. Each
client receives the leading block of every global tensor its level holds, trains it with the
masked loss, and the server averages each global entry over the clients that hold it
(strategies/heterofl_math.py), a classifier row only over the clients that have its class. A
client's level comes from the assignment (``model.assign``) or from its device (node config
``model``); ``assignment=dynamic`` draws the level of every sampled client anew each round, with
the static assignment's proportions (HeteroFL's dynamic setting; a node that announced its level
keeps it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from typing_extensions import override

from pflower.client_app.roles.heterofl import HETEROFL_CLASSES, HeteroFLArgs
from pflower.protocol.options import option

from .base.hooks import MethodTraits, Uplink
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate
from .heterofl_math import fits_inside, partial_average, slice_arrays

WEIGHTINGS = ("uniform", "examples")
ASSIGNMENTS = ("static", "dynamic")


@dataclass(frozen=True)
class HeteroFLOptions(HeteroFLArgs):
    """HeteroFL's options (``method.<name>=`` on the command line, keywords of ``HeteroFL(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    weighting: str = option(
        "uniform",
        "uniform: every client that holds an entry counts once (the paper's code) | examples: by its samples (FedAvg)",
        choices=WEIGHTINGS,
    )
    assignment: str = option(
        "static", "static: a client keeps its level | dynamic: a new draw every round", choices=ASSIGNMENTS
    )


class HeteroFL(PersonalizedStrategy):
    """Width-scaled sub-models of one global model (options: :class:`HeteroFLOptions`)."""

    name = "heterofl"
    options_type = HeteroFLOptions
    traits = MethodTraits(
        role="heterofl",
        heterogeneous=True,
        # each client's level model on the global test set at the end (Felo's metric)
        clients_evaluate_on_public=True,
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        if o.assignment == "dynamic" and not o.static_bn:
            raise ValueError(
                "heterofl assignment=dynamic needs static_bn=true: a client's BN statistics of one width cannot "
                "be kept for the next round's other width"
            )
        # a client keeps nothing when sBN recomputes its statistics (so its width may change)
        self.traits = replace(self.traits, client_keeps="none" if o.static_bn else "personal")
        self.full_arch = self._widest()
        self.model.global_arch = self.full_arch  # the run's result (Flower's Result.arrays): the widest level
        self.static_levels = dict(self.model.arch_of)

    def _widest(self) -> str:
        """The architecture every other one is a leading block of (the global model)."""
        shapes = {a: {k: t[0] for k, t in self.model.template_of_arch(a).items()} for a in self.model.schemas}
        for arch, full in shapes.items():
            if all(set(sub) <= set(full) and all(fits_inside(sub[k], full[k]) for k in sub) for sub in shapes.values()):
                return arch
        raise ValueError(
            f"heterofl needs width levels of one model (every tensor of each a leading block of the widest's), "
            f"but the architectures {sorted(shapes)} are not: use one model at several widths "
            "(conf/model/lenet5_widths.yaml)"
        )

    # ------------------------------------------------------------------ levels
    @override
    def sample(self, server_round: int) -> list[int]:
        chosen = super().sample(server_round)
        if self.options.assignment == "dynamic":
            self.assign_levels(chosen, server_round)
        return chosen

    def assign_levels(self, client_ids: Iterable[int], server_round: int) -> None:
        """Dynamic levels: each client's drawn from the static assignment's proportions, from a stream
        of (seed, round) alone (a resumed run draws the same); announced levels are kept."""
        archs = list(self.model.schemas)
        counts = np.array([sum(1 for v in self.static_levels.values() if v == a) for a in archs], float)
        rng = np.random.default_rng([int(self.run.seed), int(server_round), 4813])
        for cid in sorted(client_ids):
            level = archs[int(rng.choice(len(archs), p=counts / counts.sum()))]
            if cid not in self.model.announced:
                self.model.arch_of[cid] = level

    @override
    def prepare_round(self, server_round: int, task: str) -> None:
        """The final evaluation scores every client at its static level."""
        if task == "evaluate":
            self.model.arch_of.update({c: a for c, a in self.static_levels.items() if c not in self.model.announced})

    # ------------------------------------------------------------------ messages
    @override
    def downlinks(self, client_ids: Sequence[int], server_round: int) -> dict[int, dict[str, np.ndarray]]:
        full = self.model.arrays[self.full_arch]
        return {
            cid: slice_arrays(full, {k: t[0] for k, t in self.model.template_of(cid).items()}) for cid in client_ids
        }

    @override
    def uplink(self, client_id: int, server_round: int) -> Uplink:
        up = super().uplink(client_id, server_round)
        if not self.options.label_split:
            return up
        return replace(up, extra={HETEROFL_CLASSES: ((self.num_classes,), np.dtype(np.uint8))})

    @property
    def num_classes(self) -> int:
        """The classifier's output width, read from the model: the label mask's length."""
        schema = self.model.schema()
        return int(schema.template[schema.group_keys[schema.groups[-1]][0]][0][0])

    # ------------------------------------------------------------------ the round
    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        ups = [u for u in updates if u.arrays]
        if not ups:
            return {}
        full = self.model.arrays[self.full_arch]
        weights = [1.0 if self.options.weighting == "uniform" else float(u.num_examples) for u in ups]
        masks = None
        if self.options.label_split:
            schema = self.model.schema()
            head = schema.group_keys[schema.groups[-1]]
            masks = [{k: np.asarray(u.extra[HETEROFL_CLASSES], bool) for k in head} for u in ups]
        full.update(partial_average(full, [u.arrays for u in ups], weights, masks))
        levels = {a: sum(1 for u in ups if self.model.arch_of[u.client_id] == a) for a in self.model.schemas}
        return {f"clients@{a}": n for a, n in levels.items()}
