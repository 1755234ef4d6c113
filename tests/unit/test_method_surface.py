"""A method author's surface: every name a method file in strategies/ touches: the strategy base's
declarations, parts and hooks (overridden or reached as ``self.<name>``), the members of the parts
(``self.run.draw``, ``self.model.groups``, ``self.clients.exchange``), the MethodTraits fields it
sets and what it imports from strategies/base/ and protocol/. The names are listed here by kind, so
a change to the surface is a change to this file, and each is documented on
docs/adding-a-method.md, which states the count."""

from __future__ import annotations

import ast
from pathlib import Path

from pflower.strategies import STRATEGIES
from pflower.strategies.base.client_spec import client_spec
from pflower.strategies.base.strategy import PersonalizedStrategy

ROOT = Path(__file__).resolve().parents[2]
#: every name a method file in strategies/ touches, by kind; docs/adding-a-method.md documents each
SURFACE: dict[str, set[str]] = {
    # what a method declares, the parts it reads, the hooks it overrides (the base's own names)
    "declarations": {"name", "options_type", "traits"},
    "parts": {"options", "run", "model", "clients"},
    "hooks": {
        "prepare_round",
        "sample",
        "personal_groups",
        "personal_keys",
        "downlinks",
        "extra_downlinks",
        "uplink",
        "role_config",
        "relay",
        "aggregate",
        "attach_public",
        "run_summary",
        "write_artifacts",
    },
    # the members of the parts it reaches (self.run.<name>, self.model.<name>, self.clients...)
    "run": {"num_clients", "seed", "fraction", "client_spec", "lr_schedule", "history", "draw", "client_store"},
    "model": {
        "groups",
        "keys",
        "global_arrays",
        "template",
        "schema",
        "schemas",
        "arrays",
        "default",
        "arch_of",
        "template_of",
        "template_of_arch",
        "global_arch",
        "announced",
    },
    "clients": {"exchange", "get"},
    # the MethodTraits fields it sets
    "traits": {
        "role",
        "state",
        "client_keeps",
        "shared_buffers",
        "heterogeneous",
        "linear_head",
        "needs_public_data",
        "evaluates_on_public",
        "clients_evaluate_on_public",
        "diagnostic_panels",
    },
    # what it imports from strategies/base/ and protocol/
    "imports": {
        "PersonalizedStrategy",
        "MethodTraits",
        "MethodOptions",
        "option",
        "Uplink",
        "Absorb",
        "ClientUpdate",
        "Panel",
        "phase_rounds",
        "global_test_numbers",
        "weighted_test_metrics",
    },
}
#: the count the page states ("The surface: N names"); issue 71 asked for 25, which the 13 hooks,
#: 10 traits, 3 declarations and 4 parts alone exceed: this bound only goes down
MOST_NAMES = 64


def base_names() -> set[str]:
    """The base's class members and the instance attributes its ``__init__`` sets."""
    members = {
        name
        for cls in PersonalizedStrategy.__mro__
        if cls.__module__.startswith("pflower")
        for name in vars(cls)
        if not name.startswith("_")
    }
    import torch

    instance = vars(PersonalizedStrategy(torch.nn.Sequential(torch.nn.Linear(2, 2)), client_spec(), num_clients=2))
    return members | {name for name in instance if not name.startswith("_")}


def surface(files: list[Path], names: set[str]) -> tuple[set[str], set[str]]:
    """(names the methods' classes override, names they reach as ``self.<name>``)."""
    overridden, used = set(), set()
    strategies = {"PersonalizedStrategy"} | {cls.__name__ for cls in STRATEGIES.values()}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            bases = {b.id for b in getattr(node, "bases", []) if isinstance(b, ast.Name)}
            if isinstance(node, ast.ClassDef) and bases & strategies:  # not a helper class (a torch module)
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name in names:
                        overridden.add(item.name)
                    targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
                    overridden |= {t.id for t in targets if isinstance(t, ast.Name) and t.id in names}
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                if node.attr in names:
                    used.add(node.attr)
    return overridden, used


def touched(files: list[Path]) -> dict[str, set[str]]:
    """Every name of :data:`SURFACE`'s kinds that ``files`` touch: the base's names (overridden or
    reached as ``self.<name>``), members of the parts, MethodTraits fields and base/protocol imports."""
    overridden, used = surface(files, base_names())
    own = overridden | used
    found: dict[str, set[str]] = {kind: set() for kind in SURFACE}
    for kind in ("declarations", "parts", "hooks"):
        found[kind] = own & SURFACE[kind]
    found["base, other"] = own - SURFACE["declarations"] - SURFACE["parts"] - SURFACE["hooks"]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                part = _part_of(node.value)
                if part:
                    found[part].add(node.attr)
            elif isinstance(node, ast.Call) and _is_traits_call(node):
                found["traits"] |= {k.arg for k in node.keywords if k.arg}
            elif isinstance(node, ast.ImportFrom) and _from_base_or_protocol(node):
                found["imports"] |= {a.name for a in node.names}
    return found


def _part_of(value: ast.expr) -> str | None:
    """``self.run`` -> "run" (also ``self.clients[cid]`` -> "clients"); None for anything else."""
    if isinstance(value, ast.Subscript):
        value = value.value
    is_part = isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "self"
    return value.attr if is_part and value.attr in ("run", "model", "clients") else None


def _is_traits_call(node: ast.Call) -> bool:
    """``MethodTraits(...)`` or ``replace(Parent.traits, ...)``."""
    func = node.func
    if isinstance(func, ast.Name) and func.id == "MethodTraits":
        return True
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    first = node.args[0] if node.args else None
    return name == "replace" and isinstance(first, ast.Attribute) and first.attr == "traits"


def _from_base_or_protocol(node: ast.ImportFrom) -> bool:
    module = ("." * node.level) + (node.module or "")
    return module.startswith((".base", "pflower.strategies.base", "pflower.protocol", "..protocol"))


def method_files() -> list[Path]:
    """The method files: strategies/*.py but the registry (__init__.py)."""
    return [p for p in sorted((ROOT / "strategies").glob("*.py")) if p.name != "__init__.py"]


def test_a_method_touches_only_the_documented_names():
    found = touched(method_files())
    extra = {kind: sorted(names - SURFACE.get(kind, set())) for kind, names in found.items()}
    assert {k: v for k, v in extra.items() if v} == {}, "add each to SURFACE and docs/adding-a-method.md"
    unused = {kind: sorted(SURFACE[kind] - found[kind]) for kind in SURFACE}
    assert {k: v for k, v in unused.items() if v} == {}, "no method touches these: drop them from SURFACE"


def test_the_surface_is_counted_on_the_page_and_only_shrinks():
    total = sum(len(names) for names in SURFACE.values())
    page = (ROOT / "docs" / "adding-a-method.md").read_text()
    assert f"## The surface: {total} names" in page
    assert total <= MOST_NAMES


def test_every_name_of_the_surface_is_on_the_adding_a_method_page():
    page = (ROOT / "docs" / "adding-a-method.md").read_text()
    missing = sorted(f"{kind}: {n}" for kind, names in SURFACE.items() for n in names if f"`{n}" not in page)
    assert not missing, missing


def test_the_count_sees_an_override_a_call_and_a_part(tmp_path):
    """The check itself: overriding ``sample`` and calling ``self.run.draw`` counts ``sample`` and ``run``;
    a base helper reached directly (``self.ledger``) counts too."""
    method = tmp_path / "m.py"
    method.write_text(
        "class M(PersonalizedStrategy):\n    name = 'm'\n    def sample(self, r):\n"
        "        self.ledger.reset()\n        return self.run.draw([1], 1)\n"
    )
    assert surface([method], base_names()) == ({"name", "sample"}, {"ledger", "run"})
