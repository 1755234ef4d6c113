"""A method author's surface: the names of the strategy base that the methods in strategies/
override or reach as ``self.<name>``: its class members (hooks, declarations) and the parts its
``__init__`` sets (``options``, ``run``, ``model``, ``clients``). Issue 61 asked for at most 20;
this test keeps it there, and lists the names so a change to the surface is a change to this file."""

from __future__ import annotations

import ast
from pathlib import Path

from pflower.strategies import STRATEGIES
from pflower.strategies.base.client_spec import client_spec
from pflower.strategies.base.strategy import PersonalizedStrategy

ROOT = Path(__file__).resolve().parents[2]
SURFACE = {
    # what a method declares
    "name",
    "options_type",
    "traits",
    # the parts it reads
    "options",
    "run",
    "model",
    "clients",
    # the hooks it overrides
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
}


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


def test_the_method_authors_surface_is_the_documented_twenty_names():
    overridden, used = surface(sorted((ROOT / "strategies").glob("*.py")), base_names())
    assert overridden | used <= SURFACE, sorted((overridden | used) - SURFACE)
    assert len(SURFACE) <= 20


def test_every_hook_of_the_surface_is_on_the_adding_a_method_page():
    page = (ROOT / "docs" / "adding-a-method.md").read_text()
    missing = sorted(n for n in SURFACE if f"`{n}" not in page)
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
