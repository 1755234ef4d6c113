"""A method's options, declared once.

Each option is one field made with :func:`option`: its default, type (the annotation), allowed
values or range, and a line of documentation. An option the client reads is declared in its
role's arguments (a :class:`pflower.protocol.role_args.RoleArgs` beside the role, in
``client_app/roles/``); the method's options dataclass beside its strategy extends that class
with the options only the server reads. Everything else reads that declaration: the strategy
(``self.options``, built and checked before round 1), the client role (``self.args``, the same
fields decoded from the message), hydra's ``method=<name>`` (``conf/method/<name>.yaml`` starts
from the defaults registered by :func:`pflower.server_app.config.register_method_options` and
names no option again), config validation (``pflower sim`` refuses a bad value before any run
starts, naming the option), ``pflower methods NAME`` and the docs' tables.

A field made with :func:`sent` is not an option: its value is one the strategy computes for its
client (FedCMD's phase, FedRep's head groups) and sends with the options.
"""

from __future__ import annotations

import dataclasses
import operator
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar


class OptionError(ValueError):
    """A method option that cannot work; the message names the method, the option and the fix."""

    user_error = True  # one `pflower:` line in Flower's log, not a traceback (pflower.logs)

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


def option(
    default: Any,
    doc: str,
    *,
    choices: Sequence[Any] | None = None,
    low: float | None = None,
    high: float | None = None,
    above: float | None = None,
    below: float | None = None,
) -> Any:
    """A field of a :class:`MethodOptions` dataclass: ``low``/``high`` are inclusive bounds,
    ``above``/``below`` strict ones; ``choices`` the allowed values (``None`` always allowed
    when the annotation admits it)."""
    return _field(default, doc, choices=choices, low=low, high=high, above=above, below=below)


def sent(default: Any, doc: str, **bounds: Any) -> Any:
    """A field of a role's arguments that is no user option: the strategy computes it (from the
    model, the round or several options) and sends it. Checked like an option (``bounds``: those
    of :func:`option`), never listed, composed or accepted as ``method.<name>=``."""
    return _field(default, doc, sent=True, **bounds)


def _field(
    default: Any,
    doc: str,
    *,
    sent: bool = False,
    choices: Sequence[Any] | None = None,
    low: float | None = None,
    high: float | None = None,
    above: float | None = None,
    below: float | None = None,
) -> Any:
    meta = {
        "doc": doc,
        "choices": tuple(choices) if choices is not None else None,
        "low": low,
        "high": high,
        "above": above,
        "below": below,
        "sent": sent,
    }
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def is_option(f: dataclasses.Field) -> bool:
    """Whether a field is a user option (not a :func:`sent` value)."""
    return not f.metadata.get("sent", False)


def _accepts(tp: Any, value: Any) -> tuple[bool, Any]:
    """Whether ``value`` fits the annotation ``tp``, and the value as stored (an int for a float
    field becomes a float; a tuple for a list field a list)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            return type(None) in args, None
        for arg in sorted(args, key=lambda a: a is float):  # an int stays an int where int is allowed
            ok, out = _accepts(arg, value)
            if ok:
                return True, out
        return False, value
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            return False, value
        checked = [_accepts(item, v) for v in value]
        return all(ok for ok, _ in checked), [v for _, v in checked]
    if tp is Any:
        return True, value
    if tp is type(None):
        return value is None, value
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    return isinstance(value, tp), value


def type_name(tp: Any) -> str:
    """A type as an error message and the options table write it (``float | null``)."""
    return str(tp).replace("typing.", "").replace("<class '", "").replace("'>", "").replace("NoneType", "null")


@dataclass(frozen=True)
class MethodOptions:
    """Base of every method's options (a method with none uses it as it is)."""

    _hints: ClassVar[dict[type, dict[str, Any]]] = {}

    @classmethod
    def hints(cls) -> dict[str, Any]:
        """The fields' resolved types (cached: the check of every value reads them)."""
        if cls not in MethodOptions._hints:
            MethodOptions._hints[cls] = typing.get_type_hints(cls)
        return MethodOptions._hints[cls]

    def __post_init__(self) -> None:
        hints = self.hints()
        for f in fields(self):
            given = getattr(self, f.name)
            ok, value = _accepts(hints[f.name], given)
            problem = None if ok else type_name(hints[f.name])
            problem = problem or out_of_range(f, value)
            if problem:
                raise OptionError(f"option {f.name} must be {problem}, got {given!r}", f.name)
            object.__setattr__(self, f.name, value)

    @classmethod
    def names(cls) -> list[str]:
        """The option names, in declaration order (what ``method.<name>=`` accepts)."""
        return [f.name for f in fields(cls) if is_option(f)]

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each option's default: the one place a default is written (the yaml starts from it)."""
        return {
            f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            for f in fields(cls)
            if is_option(f)
        }

    @classmethod
    def build(cls, method: str, values: Mapping[str, Any]) -> MethodOptions:
        """The options of ``method`` from ``values`` (its config keys); unknown keys and bad values
        fail with one message naming the method, the option, and where to set it."""
        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            import difflib

            close = [m for u in unknown for m in difflib.get_close_matches(u, list(cls.names()), n=1)]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise OptionError(
                f"method {method!r} has no option(s) {unknown}{hint}; its options: {cls.names() or 'none'}"
            )
        try:
            return cls(**values)
        except OptionError as e:
            raise OptionError(
                f"method {method!r}: {e}; set method.{e.option}=<value> (`pflower methods {method}` lists the options)",
                e.option,
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """The options' values by name (the run's summary and log list them)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if is_option(f)}

    @classmethod
    def describe(cls) -> list[dict[str, str]]:
        """One row per option: name, type, default, what is allowed, its documentation."""
        hints, defaults = cls.hints(), cls.defaults()
        rows = []
        for f in fields(cls):
            if not is_option(f):
                continue
            default = defaults[f.name]
            rows.append(
                {
                    "option": f.name,
                    "type": type_name(hints[f.name]),
                    "default": "null"
                    if default is None
                    else str(default).lower()
                    if isinstance(default, bool)
                    else str(default),
                    "allowed": allowed(f),
                    "doc": f.metadata.get("doc", ""),
                }
            )
        return rows


# the bounds a field may declare: metadata key, its comparison, how it reads
BOUNDS = (
    ("low", operator.ge, ">="),
    ("above", operator.gt, ">"),
    ("high", operator.le, "<="),
    ("below", operator.lt, "<"),
)


def out_of_range(f: dataclasses.Field, value: Any) -> str | None:
    """What ``value`` of field ``f`` breaks (None when it is allowed)."""
    m = f.metadata
    if value is None:
        return None
    choices = m.get("choices")
    if choices is not None and any(type(c) is type(value) for c in choices) and value not in choices:
        return allowed(f)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if any(m.get(key) is not None and not holds(value, m[key]) for key, holds, _ in BOUNDS):
            return allowed(f)
    return None


def allowed(f: dataclasses.Field) -> str:
    """The field's constraint in words ('' when any value of its type is allowed)."""
    m = f.metadata
    parts = []
    if m.get("choices") is not None:
        parts.append(f"one of {list(m['choices'])}")
    rng = " and ".join(f"{word} {m[key]}" for key, _, word in BOUNDS if m.get(key) is not None)
    if rng:
        parts.append(("a number " if parts else "") + rng)
    return ", or ".join(parts)
