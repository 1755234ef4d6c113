"""A client's persistent personal state: personal tensors and BN buffers.

Kept in ``context.state`` (survives rounds in one SuperNode process) and, when the node
config names a ``state-dir``, written atomically to ``<state-dir>/<run>/client_<id>.pt`` so a
restarted SuperNode gets its personalization back.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context

STATE_KEY = "pflower.personal"


class ClientState:
    """Load and save the tensors a client keeps between rounds."""

    def __init__(self, context: Context, client_id: int, run_token: str, state_dir: str | None = None) -> None:
        self.context = context
        self.path = None
        if state_dir:
            self.path = Path(state_dir).expanduser() / _safe(run_token) / f"client_{client_id}.pt"
        self.run_token = run_token

    def load(self) -> dict[str, torch.Tensor]:
        """Tensors saved last round (empty on first contact)."""
        record = self.context.state.array_records.get(STATE_KEY) if hasattr(self.context.state, "array_records") else None
        if record is not None and record.get("__run__") is not None:
            if bytes(record["__run__"].numpy()).decode() == self.run_token:
                return {k: torch.from_numpy(v.numpy().copy()) for k, v in record.items() if k != "__run__"}
        if self.path is not None and self.path.exists():
            try:
                return torch.load(self.path, map_location="cpu", weights_only=True)
            except Exception as exc:  # a torn or foreign file must not kill the client
                raise RuntimeError(f"cannot read client state {self.path}: {exc}; delete it to start fresh") from exc
        return {}

    def save(self, tensors: dict[str, torch.Tensor]) -> None:
        arrays = {k: Array(v.detach().cpu().numpy()) for k, v in tensors.items()}
        arrays["__run__"] = Array(np.frombuffer(self.run_token.encode(), dtype=np.uint8).copy())
        self.context.state[STATE_KEY] = ArrayRecord(array_dict=arrays)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            os.close(fd)
            torch.save({k: v.detach().cpu() for k, v in tensors.items()}, tmp)
            os.replace(tmp, self.path)


def _safe(token: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in token) or "run"
