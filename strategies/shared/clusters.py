"""Clustered aggregation: disjoint groups of clients, each with its own model.

CFL, FedCPMD and FedTSDP all keep a partition of the clients and one model per part; a client
receives its cluster's model and the round's updates are averaged inside each cluster only.
:class:`Clusters` holds that state (checkpointed as it is: a dataclass of plain values and
arrays) and the operations they share; the methods keep only their own rule for forming
clusters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from .aggregation import fedavg
from .model_distance import copy_arrays

Arrays = Mapping[str, np.ndarray]


class Update(Protocol):
    """What clustered aggregation reads of a client's reply (the base's ``ClientUpdate`` is one)."""

    @property
    def client_id(self) -> int: ...
    @property
    def arrays(self) -> Arrays: ...
    @property
    def num_examples(self) -> int: ...


U = TypeVar("U", bound=Update)


@dataclass
class Clusters:
    """``members[c]``: the sorted client ids of cluster c; ``models[c]``: its arrays (by key)."""

    members: list[list[int]]
    models: list[dict[str, np.ndarray]]
    _index: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.members) != len(self.models):
            raise ValueError(f"{len(self.members)} clusters but {len(self.models)} models")
        self.members = [sorted(int(c) for c in m) for m in self.members]
        self._index = {c: i for i, m in enumerate(self.members) for c in m}
        if len(self._index) != sum(len(m) for m in self.members):
            raise ValueError("a client is in two clusters")

    @classmethod
    def single(cls, client_ids: Iterable[int], model: Arrays) -> Clusters:
        """One cluster of every client (the start of CFL and FedTSDP)."""
        return cls([sorted(int(c) for c in client_ids)], [copy_arrays(model)])

    def __len__(self) -> int:
        return len(self.members)

    def of(self, client_id: int) -> int:
        """The index of ``client_id``'s cluster (KeyError if it is in none)."""
        return self._index[client_id]

    def get(self, client_id: int) -> int | None:
        return self._index.get(client_id)

    def model_of(self, client_id: int) -> dict[str, np.ndarray]:
        return self.models[self._index[client_id]]

    def sizes(self) -> list[int]:
        return [len(m) for m in self.members]

    def largest(self) -> int:
        """The index of the largest cluster (the first of equals)."""
        return max(range(len(self.members)), key=lambda c: (len(self.members[c]), -c))

    def group(self, updates: Sequence[U]) -> dict[int, list[U]]:
        """The round's updates with arrays, by cluster index (client-id order inside; clients in no cluster left
        out)."""
        out: dict[int, list[U]] = {}
        for u in sorted(updates, key=lambda u: u.client_id):
            c = self._index.get(u.client_id)
            if u.arrays and c is not None:
                out.setdefault(c, []).append(u)
        return out

    def add(self, client_id: int, cluster: int) -> None:
        """Put a client (in no cluster yet) into ``cluster``."""
        if client_id in self._index:
            raise ValueError(f"client {client_id} is already in cluster {self._index[client_id]}")
        self.members[cluster] = sorted([*self.members[cluster], client_id])
        self._index[client_id] = cluster

    def to_dict(self) -> dict[str, Any]:
        return {"members": [list(m) for m in self.members], "models": [copy_arrays(m) for m in self.models]}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Clusters:
        return cls([[int(c) for c in m] for m in state["members"]], [copy_arrays(m) for m in state["models"]])


def cluster_fedavg(updates: Sequence[Update], keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """FedAvg of one cluster's updates (over ``keys``, default all they hold)."""
    models = [u.arrays if keys is None else {k: u.arrays[k] for k in keys} for u in updates]
    return fedavg(models, [u.num_examples for u in updates])
