"""A client's persistent personal state: personal tensors and BN buffers, by round.

Kept in ``context.state`` (survives rounds in one SuperNode process) and, when the node
config names a ``state-dir``, written atomically to ``<state-dir>/<run>/client_<id>.pt`` so a
restarted SuperNode gets its personalization back.

Each save is tagged with its round, and the last ``versions`` saves are kept. The server
checkpoints every ``checkpoint_every`` rounds; if it crashes, it replays the rounds after its
last checkpoint, and a client may already have saved some of them. Loading "the newest state
saved before round r" then gives the client the state the replayed round saw the first time,
and with ``versions = checkpoint_every + 1`` that state is always still kept (a crash loses
at most ``checkpoint_every`` rounds). Versions of rounds being replayed are dropped when the
replay saves.
"""

from __future__ import annotations

import os
import re
import tempfile
from logging import WARNING
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context
from flwr.common import log

STATE_KEY = "pflower.personal"
_VERSIONED = re.compile(r"^r(\d+)/(.+)$")
# an empty tensor saved with every version: a client whose model keeps no tensor (no BN, no
# personal layer) still shows which rounds it saved, so "kept nothing" differs from "lost it"
MARKER = "__saved__"

Versions = dict[int, dict[str, torch.Tensor]]  # round -> tensors saved after it


class ClientState:
    """Load and save the tensors a client keeps between rounds."""

    def __init__(
        self, context: Context, client_id: int, run_token: str, state_dir: str | None = None, versions: int = 1
    ) -> None:
        if versions < 1:
            raise ValueError(f"versions must be >= 1, got {versions}")
        self.context = context
        self.path = None
        if state_dir:
            self.path = Path(state_dir).expanduser() / _safe(run_token) / f"client_{client_id}.pt"
        self.run_token = run_token
        self.versions = versions

    def load(self, before_round: int | None = None) -> dict[str, torch.Tensor]:
        """The tensors of the newest save from a round before ``before_round`` (all: None); empty on first contact."""
        saved = self._all()
        if not saved:
            return {}
        eligible = [r for r in saved if before_round is None or r < before_round]
        if not eligible:  # only newer saves: not reachable with versions = checkpoint_every + 1
            log(
                WARNING,
                "client state %s holds rounds %s only, none before round %s; using the oldest",
                self.path,
                sorted(saved),
                before_round,
            )
            eligible = [min(saved)]
        return saved[max(eligible)]

    def newest_round(self) -> int:
        """The newest round this client saved state after, for this run (0: it holds none)."""
        return max(self._all(), default=0)

    def save(self, tensors: dict[str, torch.Tensor], server_round: int = 0) -> None:
        """Add round ``server_round``'s tensors; drop saves of this and later rounds, keep the newest ``versions``."""
        kept = {r: t for r, t in self._all().items() if r < server_round}
        kept[server_round] = {k: v.detach().cpu() for k, v in tensors.items()}
        kept = {r: kept[r] for r in sorted(kept)[-self.versions :]}
        flat = {f"r{r}/{k}": v for r, t in kept.items() for k, v in t.items()}
        flat.update({f"r{r}/{MARKER}": torch.zeros(0) for r in kept})
        arrays = {k: Array(v.numpy()) for k, v in flat.items()}
        arrays["__run__"] = Array(np.frombuffer(self.run_token.encode(), dtype=np.uint8).copy())
        self.context.state[STATE_KEY] = ArrayRecord(array_dict=arrays)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            os.close(fd)
            torch.save(flat, tmp)
            os.replace(tmp, self.path)

    def _all(self) -> Versions:
        """Every kept save, from the node's context if it has this run's, else from the file."""
        in_context = context_versions(self.context, self.run_token)
        if in_context:
            return in_context
        if self.path is not None and self.path.exists():
            try:
                return read_state_file(self.path)
            except Exception as exc:  # a torn or foreign file must not kill the client
                raise RuntimeError(f"cannot read client state {self.path}: {exc}; delete it to start fresh") from exc
        return {}


def context_versions(context: Context, run_token: str | None = None) -> Versions:
    """The saves a node's context holds, by round (those of run ``run_token`` only, when given)."""
    record = context.state.array_records.get(STATE_KEY) if hasattr(context.state, "array_records") else None
    if record is None or record.get("__run__") is None:
        return {}
    if run_token is not None and bytes(record["__run__"].numpy()).decode() != run_token:
        return {}
    return _split({k: torch.from_numpy(v.numpy().copy()) for k, v in record.items() if k != "__run__"})


def read_state_file(path: str | Path) -> Versions:
    """The saves a state file holds, by round (for tools and tests that inspect a node's disk)."""
    return _split(torch.load(path, map_location="cpu", weights_only=True))


def _split(flat: dict[str, torch.Tensor]) -> Versions:
    """``{"r3/fc.weight": t}`` -> ``{3: {"fc.weight": t}}``; unversioned keys (older files) count as round 0."""
    out: Versions = {}
    for key, value in flat.items():
        match = _VERSIONED.match(key)
        rnd, name = (int(match.group(1)), match.group(2)) if match else (0, key)
        tensors = out.setdefault(rnd, {})
        if name != MARKER:
            tensors[name] = value
    return out


def _safe(token: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in token) or "run"
