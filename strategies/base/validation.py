"""Reply validation: a client's reply is checked before anything of it is aggregated.

A reply that fails is dropped with a reason naming the client and the problem; the
round goes on with the others. These are plain functions on Flower records so they
are testable without a Flower runtime.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

REQUIRED_METRICS = ("num-examples", "client-id", "test_size")


@dataclass
class ClientUpdate:
    """One validated reply: what a method's aggregation works with."""

    client_id: int
    node_id: int
    arrays: dict[str, np.ndarray]
    num_examples: int
    metrics: dict[str, float]
    configs: dict[str, Any] = field(default_factory=dict)
    bytes_up: int = 0
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # validated "extra/<name>/<key>" arrays, prefix removed


class InvalidReply(ValueError):
    """A reply that must not be aggregated; the message says why."""


def record_bytes(record: ArrayRecord) -> int:
    """Bytes an ArrayRecord carries on the wire (serialized arrays)."""
    return sum(len(arr.data) for arr in record.values())


def validate_reply(
    content: RecordDict,
    *,
    node_id: int,
    expected_client: int | None,
    expected_arrays: Mapping[str, tuple[tuple[int, ...], np.dtype]]
    | Sequence[Mapping[str, tuple[tuple[int, ...], np.dtype]]],
    expected_train_size: int | None = None,
    expected_test_size: int | None = None,
) -> ClientUpdate:
    """Check keys, shapes, dtypes, finite values and plausible counts; return the parsed update.

    ``expected_arrays`` is the one key set (with shapes and dtypes) the reply must hold, or a list
    of alternatives (a client that chooses what it uploads, as BLS's layer prefixes): the reply's
    keys must equal one of them exactly.
    """
    metrics = _single(content.metric_records, "MetricRecord", node_id)
    for key in REQUIRED_METRICS:
        if key not in metrics:
            raise InvalidReply(f"node {node_id}: metric {key!r} missing")
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, list) or not math.isfinite(float(value)):
            raise InvalidReply(f"node {node_id}: metric {key!r} is not a finite number ({value!r})")
        flat[key] = float(value)
    client_id = int(flat["client-id"])
    who = f"client {client_id} (node {node_id})"
    if expected_client is not None and client_id != expected_client:
        raise InvalidReply(f"{who}: replied as client {client_id}, expected {expected_client}")
    n = flat["num-examples"]
    if n != int(n) or n <= 0:
        raise InvalidReply(f"{who}: num-examples must be a positive integer, got {n}")
    if expected_train_size is not None and int(n) != expected_train_size:
        raise InvalidReply(
            f"{who}: num-examples {int(n)} does not match the {expected_train_size} training "
            "samples it announced (a forged count would skew the average)"
        )
    if expected_test_size is not None and int(flat["test_size"]) != expected_test_size:
        raise InvalidReply(f"{who}: test_size {int(flat['test_size'])} != announced {expected_test_size}")

    arrays: dict[str, np.ndarray] = {}
    nbytes = 0
    options = [expected_arrays] if isinstance(expected_arrays, Mapping) else list(expected_arrays) or [{}]
    if any(options) or content.array_records:
        record = _single(content.array_records, "ArrayRecord", node_id) if content.array_records else ArrayRecord()
        got = set(record.keys())
        chosen = next((o for o in options if set(o) == got), None)
        if chosen is None:
            want = set(options[0]) if len(options) == 1 else set().union(*options)
            missing, extra = sorted(want - got), sorted(got - want)
            if len(options) == 1:
                raise InvalidReply(f"{who}: array keys differ: missing {missing[:5]}, unexpected {extra[:5]}")
            raise InvalidReply(
                f"{who}: its {len(got)} arrays are none of the {len(options)} upload sets the server allows "
                f"(unexpected {extra[:5]}, sizes allowed {sorted({len(o) for o in options})})"
            )
        for key, (shape, dtype) in chosen.items():
            arr = record[key].numpy()
            if tuple(arr.shape) != tuple(shape):
                raise InvalidReply(f"{who}: {key} has shape {tuple(arr.shape)}, expected {tuple(shape)}")
            if arr.dtype != dtype:
                raise InvalidReply(f"{who}: {key} has dtype {arr.dtype}, expected {dtype}")
            if not np.all(np.isfinite(arr)):
                raise InvalidReply(f"{who}: {key} holds NaN or infinite values")
            arrays[key] = arr
        nbytes = record_bytes(record)

    configs: dict[str, Any] = {}
    for rec in content.config_records.values():
        configs.update(dict(rec))
    return ClientUpdate(client_id, node_id, arrays, int(n), flat, configs, nbytes)


def _single(records: Mapping[str, Any], kind: str, node_id: int) -> Any:
    if len(records) != 1:
        raise InvalidReply(f"node {node_id}: expected exactly one {kind}, got {len(records)}")
    return next(iter(records.values()))


__all__ = ["ClientUpdate", "ConfigRecord", "InvalidReply", "MetricRecord", "record_bytes", "validate_reply"]
