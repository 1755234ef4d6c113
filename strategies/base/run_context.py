"""``self.run``: what a method reads about the run it is part of (a part of the strategy base)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .schedule import LRSchedule
from .store import ClientStore, open_store


@dataclass
class RunContext:
    """The run's size, seed and sampling stream, its round history and its per-client stores.

    ``rng`` is the run's one sampling stream: every method draws its clients from it (through
    :meth:`draw`), so methods compare on the same client sample stream; it is checkpointed with
    the base. ``history`` holds one record per aggregated round (what metrics.jsonl holds).
    """

    method: str
    num_clients: int
    seed: int
    fraction: float  # the share of clients sampled a round (Flower's fraction_train)
    min_clients: int  # the fewest sampled (Flower's min_train_nodes)
    client_spec: dict[str, Any]  # what every client is told: data, training, model, run token
    lr_schedule: LRSchedule
    store_mode: str = "memory"
    store_dir: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    @property
    def token(self) -> str:
        """The run token: a client's personal state belongs to one run."""
        return str(self.client_spec.get("run", ""))

    def sample_size(self) -> int:
        """Clients a round samples: ``fraction`` of them, at least ``min_clients``."""
        return max(self.min_clients, int(self.fraction * self.num_clients))

    def draw(self, population: Sequence[int] | range, k: int) -> list[int]:
        """``k`` distinct client ids from ``population``, uniformly, from the run's seeded stream (sorted)."""
        pool = np.asarray(list(population), dtype=np.int64)
        if len(pool) == 0 or k <= 0:
            return []
        return sorted(int(c) for c in self.rng.choice(pool, size=min(k, len(pool)), replace=False))

    def client_store(self, name: str, bytes_per_client: int = 0) -> ClientStore:
        """A per-client array store for a method's server state (stored bodies, models): in memory
        or on disk as config ``server_store`` says (:func:`strategies.base.store.open_store`)."""
        return open_store(self.store_mode, self.store_dir, self.method, name, bytes_per_client * self.num_clients)

    def last_round(self) -> int:
        """The last round aggregated (0 before the first)."""
        return int(self.history[-1]["round"]) if self.history else 0
