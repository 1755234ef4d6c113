"""``dataset=custom``: a user's data function, partitioned by pflower's partitioners.

    pflower sim dataset=custom dataset.options.target=mypkg.data:load dataset.options.size=5000

The function (``dataset.options.target``, called with ``root`` where its signature names it and
the other options as keyword arguments) returns one map-style dataset, ``(train, test)`` or
``{"train": ..., "test": ...}`` (:func:`~.datasets.user_splits`). The input shape comes from the
images and the class count from the labels (or ``num_classes``), so nothing else is declared.
Both sides call it: it must return the same data on the server and on every simulated client.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import lru_cache
from typing import Any

from pflower.protocol.targets import call_with, import_target

from .datasets import DataHookError, check_labels, user_splits
from .sources import DatasetInfo, Splits, note_source, register

KEY = "dataset.options.target"


@lru_cache(maxsize=4)
def _load(options_json: str, root: str | None) -> Splits:
    options = json.loads(options_json)
    target = options.pop("target", None)
    options.pop("num_classes", None)
    function = import_target(target, KEY)
    try:
        returned = call_with(function, {"root": root}, options)
    except Exception as err:  # the user's code: one line naming it and what it was given, not a traceback
        given = ", ".join([f"root={root!r}"] + [f"{k}={v!r}" for k, v in sorted(options.items())])
        raise DataHookError(
            f"{KEY}={target!r} raised {type(err).__name__}: {err} (it was called with {given}: `root` is "
            "dataset.root, passed where the function's signature names it; other keyword arguments are "
            "+dataset.options.<name>=...)"
        ) from err
    return user_splits(returned, f"{KEY}={target!r}")


def read_custom(root: str | None = None, **options: Any) -> Splits:
    """The user's splits (loaded once per process and options)."""
    note_source(f"function {options.get('target')}")
    return dict(_load(json.dumps(options, sort_keys=True, default=str), root))


def _resolve(info: DatasetInfo, options: dict[str, Any], root: str | None = None) -> DatasetInfo:
    if not options:  # asked whether the name is registered: nothing to load
        return info
    splits = read_custom(root, **options)
    shapes = {x.shape[1:] for x, _ in splits.values()}
    if len(shapes) != 1:
        raise ValueError(f"{KEY}: the splits hold images of different shapes {sorted(shapes)}")
    labels_max = max(int(y.max()) for _, y in splits.values())
    num_classes = int(options.get("num_classes") or labels_max + 1)
    for name, (_, y) in splits.items():
        check_labels(y, num_classes, f"{KEY} split {name!r}")
    return replace(info, in_shape=tuple(int(s) for s in next(iter(shapes))), num_classes=num_classes, options=options)


register(
    DatasetInfo(
        "custom",
        (1, 28, 28),
        10,
        read_custom,
        how_to_get="Name a function returning your dataset(s): dataset.options.target=package.module:function",
        resolve=_resolve,
    )
)
