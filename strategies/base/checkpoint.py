"""Server checkpoints: a strategy's state in one atomically replaced, pickle-free file.

``<run dir>/checkpoint.npz`` is a NumPy zip (read with ``allow_pickle=False``): every array
of the state is a member ``a0, a1, ...``; the member ``__state__`` is the UTF-8 JSON of the
rest, in which an array is ``{"__array__": "a3"}``. Writing goes to a temporary file in the
same directory, is fsynced, then ``os.replace``-d over the previous checkpoint, so a crash
at any moment leaves either the old or the new checkpoint, never a torn one.

:func:`encode` / :func:`decode` turn a state tree into JSON + arrays and back. They handle
``None``/bool/int/float/str, lists, tuples, sets, dicts (any hashable encodable keys;
``defaultdict`` keeps its factory when the live value is one), NumPy arrays and scalars, NumPy
and torch random generators (their state: the stream goes on where it stopped), torch tensors,
dataclasses (through ``to_dict``/``from_dict`` when the class has them, else field by field) and
objects with ``state_dict``/``load_state_dict`` (torch modules, optimizers, schedulers, Felo's
knowledge store: loaded *into* the live object, which must exist). Anything else is refused with
the attribute's path, when the state is first encoded (before round 1).
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import json
import os
import tempfile
import zipfile
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

FILENAME = "checkpoint.npz"
FORMAT = 1
STATE_MEMBER = "__state__"
# classes a checkpoint may name and have rebuilt when the live object is missing
IMPORTABLE_PREFIXES = ("pflower.strategies.", "pflower.models.", "pflower.protocol.")
# checkpoints written before pflower had one import name name their classes by the old top-level
# packages (``strategies.clusters:Clusters``); such a run still resumes: old module -> new module
_BASE_PARTS = frozenset(
    "architectures checkpoint client_directory diagnostics evaluation hooks messaging options phases replies "
    "resume round_ledger round_log run_loop schedule store task_messages validation".split()
)
_SHARED_PARTS = frozenset("aggregation clustering clusters similarity model_distance".split())


def current_module(module: str) -> str:
    """The module a class lives in today, for a name a checkpoint wrote (old names are mapped)."""
    top, _, rest = module.partition(".")
    if top not in ("strategies", "models", "protocol"):
        return module
    first = rest.partition(".")[0]
    if top == "strategies" and first == "base":
        rest = "base.strategy" + rest[len("base") :]
    elif top == "strategies" and first in _BASE_PARTS:
        rest = "base." + rest
    elif top == "strategies" and first in _SHARED_PARTS:
        rest = "shared." + rest
    return f"pflower.{top}.{rest}" if rest else f"pflower.{top}"


_TAGS = (
    "__array__",
    "__tensor__",
    "__scalar__",
    "__tuple__",
    "__set__",
    "__dict__",
    "__object__",
    "__stateful__",
    "__generator__",
    "__torch_generator__",
)


# set while a checkpoint is read without a live strategy (inspection, comparisons): an object that
# would be loaded into a live one comes back as its state dict instead
_INSPECTING: contextvars.ContextVar[bool] = contextvars.ContextVar("inspecting", default=False)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written, found or read; the message names the file and the fix."""


# ---------------------------------------------------------------------- encoding
def encode(value: Any, arrays: dict[str, np.ndarray], path: str = "state") -> Any:
    """JSON-safe form of ``value``; its arrays are added to ``arrays`` (name -> array). The first
    of :data:`_ENCODERS` that takes the value's kind encodes it (their order matters: a NumPy
    scalar before a float, a ``to_dict`` object before a mapping)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    for encoder in _ENCODERS:
        out = encoder(value, arrays, path)
        if out is not _NOT_MINE:
            return out
    raise CheckpointError(
        f"cannot checkpoint {path} of type {type(value).__module__}.{type(value).__qualname__}: make it a plain "
        "value, array, tensor, dataclass, torch module or an object with state_dict()/load_state_dict(); or, if the "
        "config rebuilds it, leave it out of the method's traits.state"
    )


_NOT_MINE = object()  # an encoder's answer for a value of another kind


def _encode_number(value: Any, arrays: dict[str, np.ndarray], path: str) -> Any:
    if isinstance(value, np.generic):  # before int/float: np.float64 is a float
        if value.dtype == object:
            raise CheckpointError(f"cannot checkpoint {path}: NumPy object scalar")
        return {"__scalar__": value.dtype.str, "value": value.item()}
    return value if isinstance(value, (int, float)) else _NOT_MINE


def _encode_generator(value: Any, arrays: dict[str, np.ndarray], path: str) -> Any:
    """A NumPy generator: its bit generator's state (a plain dict) restores the stream."""
    if not isinstance(value, np.random.Generator):
        return _NOT_MINE
    bits = value.bit_generator
    return {"__generator__": type(bits).__name__, "state": encode(bits.state, arrays, f"{path}.bit_generator.state")}


def _encode_torch_generator(value: Any, arrays: dict[str, np.ndarray], path: str) -> Any:
    """A torch generator: its state (a byte tensor) restores the stream."""
    torch = _torch()
    if torch is None or not isinstance(value, torch.Generator):
        return _NOT_MINE
    name = f"a{len(arrays)}"
    arrays[name] = value.get_state().numpy().copy()
    return {"__torch_generator__": name, "device": str(value.device)}


def _encode_array(value: Any, arrays: dict[str, np.ndarray], path: str) -> Any:
    if not isinstance(value, np.ndarray):
        return _NOT_MINE
    if value.dtype.hasobject:
        raise CheckpointError(f"cannot checkpoint {path}: NumPy array of dtype object")
    name = f"a{len(arrays)}"
    arrays[name] = np.ascontiguousarray(value)
    return {"__array__": name}


def _encode_tensor(value: Any, arrays: dict[str, np.ndarray], path: str) -> Any:
    torch = _torch()
    if torch is None or not isinstance(value, torch.Tensor):
        return _NOT_MINE
    t = value.detach().cpu()
    dtype = str(t.dtype)
    if t.dtype == torch.bfloat16:
        t = t.float()
    name = f"a{len(arrays)}"
    arrays[name] = np.ascontiguousarray(t.numpy())
    return {"__tensor__": name, "dtype": dtype}


def _encode_sequence(value: Any, arrays: dict[str, np.ndarray], path: str) -> Any:
    """Lists, tuples (not named ones) and sets (sorted where their items sort)."""
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return {"__tuple__": [encode(v, arrays, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, arrays, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        items = list(value)
        try:
            items = sorted(items)
        except TypeError:
            pass
        return {"__set__": [encode(v, arrays, f"{path}{{}}") for v in items], "frozen": isinstance(value, frozenset)}
    return _NOT_MINE


def _encode_mapping(value: Any, arrays: dict[str, np.ndarray], path: str) -> Any:
    """An object saved by its ``to_dict`` (a disk-backed ClientStore: not copied item by item),
    else a mapping: a JSON object when its keys are plain strings, else (key, value) pairs."""
    if callable(getattr(value, "to_dict", None)) and callable(getattr(type(value), "from_dict", None)):
        return {"__object__": _class_path(type(value)), "to_dict": encode(value.to_dict(), arrays, path)}
    if not isinstance(value, Mapping):
        return _NOT_MINE
    if all(isinstance(k, str) and not k.startswith("__") for k in value):
        return {k: encode(v, arrays, f"{path}.{k}") for k, v in value.items()}
    pairs = [[encode(k, arrays, f"{path} key {k!r}"), encode(v, arrays, f"{path}[{k!r}]")] for k, v in value.items()]
    return {"__dict__": pairs}


def _encode_object(value: Any, arrays: dict[str, np.ndarray], path: str) -> Any:
    """A torch module or optimizer (its ``state_dict``), or a dataclass (field by field)."""
    if callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None)):
        return {
            "__stateful__": _class_path(type(value)),
            "state": encode(value.state_dict(), arrays, f"{path}.state_dict()"),
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: encode(getattr(value, f.name), arrays, f"{path}.{f.name}") for f in dataclasses.fields(value)}
        return {"__object__": _class_path(type(value)), "fields": fields}
    return _NOT_MINE


_ENCODERS = (
    _encode_number,
    _encode_generator,
    _encode_torch_generator,
    _encode_array,
    _encode_tensor,
    _encode_sequence,
    _encode_mapping,
    _encode_object,
)


def decode(value: Any, arrays: Mapping[str, np.ndarray], live: Any = None, path: str = "state") -> Any:
    """Inverse of :func:`encode`. ``live`` is the current value at this place (or None): objects
    with ``load_state_dict`` are loaded into it, and its types guide the rebuild. Each tagged form
    has its own small decoder (:data:`_DECODERS`)."""
    if isinstance(value, list):
        hints = live if isinstance(live, list) and len(live) == len(value) else [None] * len(value)
        return [decode(v, arrays, h, f"{path}[{i}]") for i, (v, h) in enumerate(zip(value, hints))]
    if not isinstance(value, dict):
        return value
    tag = next((t for t in _TAGS if t in value), None)
    if tag is None:
        hints = live if isinstance(live, Mapping) else {}
        return _like({k: decode(v, arrays, hints.get(k), f"{path}.{k}") for k, v in value.items()}, live)
    return _DECODERS[tag](value, arrays, live, path)


def _decode_array(value: dict, arrays: Mapping[str, np.ndarray], live: Any, path: str) -> np.ndarray:
    return np.array(_member(arrays, value["__array__"], path), copy=True)


def _decode_tensor(value: dict, arrays: Mapping[str, np.ndarray], live: Any, path: str) -> Any:
    import torch

    t = torch.from_numpy(np.array(_member(arrays, value["__tensor__"], path), copy=True))
    dtype = getattr(torch, str(value.get("dtype", "")).removeprefix("torch."), None)
    if isinstance(dtype, torch.dtype) and t.dtype != dtype:
        t = t.to(dtype)
    return t.to(live.device) if isinstance(live, torch.Tensor) else t


def _decode_generator(value: dict, arrays: Mapping[str, np.ndarray], live: Any, path: str) -> np.random.Generator:
    """A NumPy generator continues its stream: the live one (same bit generator) or a new one."""
    bits = getattr(np.random, str(value["__generator__"]), None)
    if not (isinstance(bits, type) and issubclass(bits, np.random.BitGenerator)):
        raise CheckpointError(f"{path}: unknown NumPy bit generator {value['__generator__']!r}")
    same_kind = isinstance(live, np.random.Generator) and type(live.bit_generator) is bits
    generator = live if same_kind else np.random.Generator(bits())
    generator.bit_generator.state = decode(value["state"], arrays, None, path)
    return generator


def _decode_torch_generator(value: dict, arrays: Mapping[str, np.ndarray], live: Any, path: str) -> Any:
    """A torch generator continues its stream: the live one, or a new one on the saved device."""
    import torch

    state = torch.from_numpy(np.array(_member(arrays, value["__torch_generator__"], path), copy=True))
    if live is None and _INSPECTING.get():
        return state
    generator = live if isinstance(live, torch.Generator) else torch.Generator(device=value.get("device", "cpu"))
    generator.set_state(state)
    return generator


def _decode_scalar(value: dict, arrays: Mapping[str, np.ndarray], live: Any, path: str) -> np.generic:
    return np.dtype(value["__scalar__"]).type(value["value"])


def _decode_tuple(value: dict, arrays: Mapping[str, np.ndarray], live: Any, path: str) -> tuple:
    items = value["__tuple__"]
    hints = live if isinstance(live, tuple) and len(live) == len(items) else [None] * len(items)
    return tuple(decode(v, arrays, h, f"{path}[{i}]") for i, (v, h) in enumerate(zip(items, hints)))


def _decode_set(value: dict, arrays: Mapping[str, np.ndarray], live: Any, path: str) -> set | frozenset:
    items = [decode(v, arrays, None, path) for v in value["__set__"]]
    return frozenset(items) if value.get("frozen") else set(items)


def _decode_dict(value: dict, arrays: Mapping[str, np.ndarray], live: Any, path: str) -> dict:
    """A mapping with keys JSON cannot hold (ints, tuples): its (key, value) pairs."""
    hints = live if isinstance(live, Mapping) else {}
    out = {}
    for k, v in value["__dict__"]:
        key = decode(k, arrays, None, path)
        out[key] = decode(v, arrays, hints.get(key), f"{path}[{key!r}]")
    return _like(out, live)


def _decode_stateful(value: dict, arrays: Mapping[str, np.ndarray], live: Any, path: str) -> Any:
    """A torch module or optimizer: its state is loaded into the freshly built one (read without
    a strategy, :meth:`Checkpoint.decode` with no ``live``: its state dict)."""
    if live is None and _INSPECTING.get():
        return decode(value["state"], arrays, None, f"{path}.state_dict()")
    if not callable(getattr(live, "load_state_dict", None)):
        raise CheckpointError(
            f"{path} was a {value['__stateful__']} when the checkpoint was written, but the freshly built strategy "
            f"holds {type(live).__name__} there: create the object in __init__ (its state is loaded into "
            "it), or give it state_dict()/load_state_dict()"
        )
    live.load_state_dict(decode(value["state"], arrays, live.state_dict(), f"{path}.state_dict()"))
    return live


def _decode_object(value: dict, arrays: Mapping[str, np.ndarray], live: Any, path: str) -> Any:
    """A dataclass (field by field) or a class with ``to_dict``/``from_dict``."""
    same_class = live is not None and _class_path(type(live)) == value["__object__"]
    cls = type(live) if same_class else _import_class(value["__object__"], path)
    if "to_dict" in value:
        return cls.from_dict(decode(value["to_dict"], arrays, live.to_dict() if live is not None else None, path))
    hints = {f.name: getattr(live, f.name, None) for f in dataclasses.fields(cls)} if live is not None else {}
    fields = {k: decode(v, arrays, hints.get(k), f"{path}.{k}") for k, v in value["fields"].items()}
    init = {f.name for f in dataclasses.fields(cls) if f.init}
    obj = cls(**{k: v for k, v in fields.items() if k in init})
    for k, v in fields.items():
        if k not in init:
            object.__setattr__(obj, k, v)
    return obj


# tag -> its decoder (value, arrays, live, path); one per tag of _TAGS
_DECODERS: dict[str, Callable[[dict, Mapping[str, np.ndarray], Any, str], Any]] = {
    "__array__": _decode_array,
    "__tensor__": _decode_tensor,
    "__scalar__": _decode_scalar,
    "__tuple__": _decode_tuple,
    "__set__": _decode_set,
    "__dict__": _decode_dict,
    "__object__": _decode_object,
    "__stateful__": _decode_stateful,
    "__generator__": _decode_generator,
    "__torch_generator__": _decode_torch_generator,
}


def _like(out: dict, live: Any) -> dict:
    if isinstance(live, defaultdict):
        return defaultdict(live.default_factory, out)
    return out


def _member(arrays: Mapping[str, np.ndarray], name: str, path: str) -> np.ndarray:
    try:
        return arrays[name]
    except KeyError:
        raise CheckpointError(f"{path}: array {name!r} is missing from the checkpoint") from None


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _import_class(spec: str, path: str) -> type:
    module, _, qualname = spec.partition(":")
    module = current_module(module)
    if not module.startswith(IMPORTABLE_PREFIXES):
        raise CheckpointError(f"{path}: the checkpoint names class {spec}, which pflower does not rebuild from a file")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _torch() -> Any:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    return torch


# ---------------------------------------------------------------------- files
def checkpoint_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FILENAME


def save_checkpoint(run_dir: str | Path, state: Mapping[str, Any]) -> Path:
    """Write ``state`` to ``<run_dir>/checkpoint.npz`` atomically (tmp file, fsync, rename)."""
    path = checkpoint_path(run_dir)
    arrays: dict[str, np.ndarray] = {}
    tree = {"format": FORMAT, "state": encode(dict(state), arrays)}
    blob = json.dumps(tree).encode("utf-8")
    arrays[STATE_MEMBER] = np.frombuffer(blob, dtype=np.uint8)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{FILENAME}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


@dataclasses.dataclass
class Checkpoint:
    """A read checkpoint: the encoded state (``tree``) and its arrays; decoded on demand."""

    path: Path
    tree: dict[str, Any]
    arrays: dict[str, np.ndarray]

    @property
    def round(self) -> int:
        return int(self.tree["round"])

    @property
    def method(self) -> str:
        return str(self.tree["method"])

    @property
    def run_token(self) -> str:
        return str(self.tree["run_token"])

    def decode(self, live: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The state as :meth:`PersonalizedStrategy.state_dict` returned it. ``live`` is a fresh
        strategy's ``state_dict()``: torch modules and the like are loaded into its objects; without
        it they come back as their state dicts."""
        token = _INSPECTING.set(live is None)
        try:
            return decode(self.tree, self.arrays, live)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(
                f"cannot resume: checkpoint {self.path} does not fit this strategy ({type(exc).__name__}: {exc})"
            ) from exc
        finally:
            _INSPECTING.reset(token)


def load_checkpoint(run_dir: str | Path) -> Checkpoint:
    """Read ``<run_dir>/checkpoint.npz``; every failure is a :class:`CheckpointError` saying what to do."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"cannot resume: run directory {run_dir} does not exist (resume=<the run's directory>)")
    path = checkpoint_path(run_dir)
    if not path.exists():
        raise CheckpointError(
            f"cannot resume: {path} does not exist (the run stopped before its first round ended, or "
            "ran with checkpoint_every=0); start a new run instead"
        )
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        tree = json.loads(bytes(arrays.pop(STATE_MEMBER)).decode("utf-8"))
        if tree.get("format") != FORMAT:
            raise ValueError(f"format {tree.get('format')!r}, this pflower reads format {FORMAT}")
        state = tree["state"]
        int(state["round"]), str(state["method"]), str(state["run_token"])
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
        raise CheckpointError(
            f"cannot resume: checkpoint {path} is unreadable ({type(exc).__name__}: {exc}). It was damaged or "
            f"written by another pflower version; nothing was changed. Start a new run, or put back {path.name} "
            "from a backup"
        ) from exc
    return Checkpoint(path, state, arrays)


def checkpointed_round(run_dir: str | Path) -> int | None:
    """The round ``<run_dir>/checkpoint.npz`` holds, reading only its small state member (a Ctrl-C's
    line names it; :func:`load_checkpoint` would read every array); None without a readable one."""
    try:
        with np.load(checkpoint_path(run_dir), allow_pickle=False) as npz:
            tree = json.loads(bytes(npz[STATE_MEMBER]).decode("utf-8"))
        return int(tree["state"]["round"])
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile):
        return None


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)
