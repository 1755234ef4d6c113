"""Per-client arrays a strategy keeps (stored bodies, models), in memory or on disk.

A :class:`ClientStore` is a mapping client id -> {key: array}. In memory it is a dict. On disk
(``directory`` set) every client's arrays are a folder of ``.npy`` files, read back memory-mapped,
so 100 VGG11 bodies (about 50 GiB) cost disk, not RAM: the server touches only the clients of
the round. Folders are written once and never changed (a new value is a new version), so a
checkpoint only records which version each client has; the versions the last checkpoint names
are kept until the next one, so a resume after a crash finds them, and the versions written
after it are removed when the store is read back.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping, MutableMapping
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import log

from ..shared.model_distance import copy_arrays

Arrays = Mapping[str, np.ndarray]

STORE_MODES = ("memory", "disk", "auto")
AUTO_DISK_BYTES = 2 * 2**30  # server_store=auto keeps a store on disk above this


def open_store(mode: str, directory: str | None, method: str, name: str, total_bytes: int) -> ClientStore:
    """A method's store ``name``: ``mode`` (config ``server_store``) ``memory``, ``disk``
    (``<directory>/<name>``, memory-mapped) or ``auto``: on disk when every client's arrays together
    (``total_bytes``) would exceed :data:`AUTO_DISK_BYTES` (100 VGG11 bodies are about 50 GiB)."""
    disk = mode == "disk" or (mode == "auto" and total_bytes > AUTO_DISK_BYTES)
    if disk and not directory:
        log(WARNING, "%s: no run directory for an on-disk server store; %s stays in memory", method, name)
        disk = False
    if disk:
        log(INFO, "%s keeps %s on disk under %s", method, name, directory)
    return ClientStore(f"{directory}/{name}" if disk else None)


class ClientStore(MutableMapping[int, dict[str, np.ndarray]]):
    """client id -> arrays; on disk under ``directory`` when one is given."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = None if directory is None else Path(directory)
        self._memory: dict[int, dict[str, np.ndarray]] = {}
        self._index: dict[int, tuple[str, list[str]]] = {}  # client -> (version folder, keys in order)
        self._pinned: set[str] = set()  # folders the last checkpoint names
        self._next = 0
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def on_disk(self) -> bool:
        return self.directory is not None

    # -- mapping
    def __getitem__(self, client_id: int) -> dict[str, np.ndarray]:
        if not self.on_disk:
            return self._memory[client_id]
        folder, keys = self._index[client_id]
        path = self.directory / folder  # type: ignore[operator]
        return {k: np.load(path / f"{i}.npy", mmap_mode="r") for i, k in enumerate(keys)}

    def keys_of(self, client_id: int) -> list[str]:
        """The keys stored for ``client_id`` (none when absent), without loading any array."""
        if not self.on_disk:
            return list(self._memory.get(client_id, ()))
        return list(self._index[client_id][1]) if client_id in self._index else []

    def __setitem__(self, client_id: int, arrays: Arrays) -> None:
        if not self.on_disk:
            self._memory[int(client_id)] = dict(arrays)
            return
        folder = f"c{int(client_id)}_v{self._next}"
        self._next += 1
        path = self.directory / folder  # type: ignore[operator]
        tmp = path.with_name(path.name + ".tmp")
        tmp.mkdir()
        keys = list(arrays)
        for i, k in enumerate(keys):
            np.save(tmp / f"{i}.npy", np.ascontiguousarray(arrays[k]))
        tmp.rename(path)
        old = self._index.get(int(client_id))
        self._index[int(client_id)] = (folder, keys)
        if old is not None:
            self._drop(old[0])

    def __delitem__(self, client_id: int) -> None:
        if not self.on_disk:
            del self._memory[client_id]
            return
        folder, _ = self._index.pop(client_id)
        self._drop(folder)

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._memory if not self.on_disk else self._index))

    def __len__(self) -> int:
        return len(self._memory if not self.on_disk else self._index)

    def _drop(self, folder: str) -> None:
        if folder not in self._pinned:
            shutil.rmtree(self.directory / folder, ignore_errors=True)  # type: ignore[operator]

    # -- checkpoint
    def to_dict(self) -> dict[str, Any]:
        """Memory: the arrays (copies). Disk: the folder of each client's current version only;
        those folders are kept until the next checkpoint (the previous pins are released)."""
        if not self.on_disk:
            return {"arrays": {str(c): copy_arrays(a) for c, a in sorted(self._memory.items())}}
        released = self._pinned - {f for f, _ in self._index.values()}
        self._pinned = {f for f, _ in self._index.values()}
        for folder in released:
            self._drop(folder)
        return {
            "directory": str(self.directory),
            "next": self._next,
            "index": {str(c): [f, list(keys)] for c, (f, keys) in sorted(self._index.items())},
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> ClientStore:
        if "directory" not in state:
            store = cls()
            store._memory = {int(c): copy_arrays(a) for c, a in state.get("arrays", {}).items()}
            return store
        store = cls(state["directory"])
        store._next = int(state["next"])
        store._index = {int(c): (str(f), [str(k) for k in keys]) for c, (f, keys) in state["index"].items()}
        missing = [f for f, _ in store._index.values() if not (store.directory / f).is_dir()]  # type: ignore[operator]
        if missing:
            raise FileNotFoundError(
                f"server store {store.directory} lacks {missing[:3]}: it does not belong to this checkpoint"
            )
        store._pinned = {f for f, _ in store._index.values()}
        for path in store.directory.iterdir():  # type: ignore[union-attr]
            if path.name not in store._pinned:  # written after the checkpoint (a crash), or half-written
                shutil.rmtree(path, ignore_errors=True)
        return store

    def nbytes(self) -> int:
        """Bytes the stored arrays take (on disk or in memory)."""
        return sum(int(np.asarray(v).nbytes) for c in self for v in self[c].values())
