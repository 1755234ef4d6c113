"""A deployed node's partition, cached on its disk after the first message.

A SuperNode that partitions a shared dataset (node config ``client-id`` without ``data-dir``
data, e.g. every node holds Fashion-MNIST) used to read, pool and partition the whole dataset
in every message, because Flower starts a fresh ClientApp process per message (1.5 s for
FMNIST). The first message now writes this client's normalized tensors to
``<cache-dir>/partitions/<key>.npz``; later processes load them in milliseconds. The key is a
hash of the whole data spec and the client id, so a different split (alpha, seed, clients,
dataset, root...) never reads a stale file. A file that cannot be read is rebuilt with a warning.

Node config ``cache-dir`` picks the directory (default ``$XDG_CACHE_HOME/pflower`` or
``~/.cache/pflower``); ``cache-dir=none`` turns the cache off. Simulation never uses it: its
processes live for the whole run and keep partitions in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.common import log

from .tensors import ClientData

CACHE_KEY = "cache-dir"  # node config
FORMAT = 1  # bump when the file's layout or the tensors' meaning changes
OFF = ("none", "off", "")


def cache_dir(node_config: Mapping[str, Any]) -> Path | None:
    """Where this node caches partitions (None: off)."""
    if CACHE_KEY in node_config:
        value = str(node_config[CACHE_KEY]).strip()
        return None if value.lower() in OFF else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pflower"


def cache_path(root: Path, spec: Mapping[str, Any], client_id: int) -> Path:
    key = json.dumps({"format": FORMAT, "spec": spec, "client": int(client_id)}, sort_keys=True, default=str)
    return root / "partitions" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.npz"


def load_or_build(
    root: Path, spec: Mapping[str, Any], client_id: int, build: Callable[[], ClientData]
) -> tuple[ClientData, bool]:
    """The client's tensors from the cache, or built by ``build()`` and written there.
    Returns (data, whether it came from the cache)."""
    path = cache_path(root, spec, client_id)
    if path.exists():
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: torch.from_numpy(z[k].copy()) for k in ("x_train", "y_train", "x_test", "y_test")}
                num_classes = int(z["num_classes"])
            return ClientData(client_id=client_id, num_classes=num_classes, **arrays), True
        except (OSError, KeyError, ValueError) as exc:
            log(WARNING, "partition cache %s is unreadable (%s): rebuilding it", path, exc)
    data = build()
    try:
        _write(path, data)
    except OSError as exc:  # a read-only or full disk costs speed, never the round
        log(
            WARNING,
            "cannot write the partition cache %s (%s): set node config %s to a writable directory or none",
            path,
            exc,
            CACHE_KEY,
        )
    return data, False


def _write(path: Path, data: ClientData) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    os.close(fd)
    try:
        np.savez(
            tmp,
            x_train=data.x_train.numpy(),
            y_train=data.y_train.numpy(),
            x_test=data.x_test.numpy(),
            y_test=data.y_test.numpy(),
            num_classes=np.int64(data.num_classes),
        )
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the whole new one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
