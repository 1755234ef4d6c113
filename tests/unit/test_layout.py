"""The house's shape, checked from the source: which part may import which, no import circle
(lazy imports inside functions and ``TYPE_CHECKING`` blocks count too: a tool reading the code
sees them), and the ServerApp's folder kept to what the ServerApp does."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pflower import PARTS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pflower", *PARTS)
#: part -> the parts it must never import (docs/architecture.md, "Parts")
FORBIDDEN = {
    "server_app": {"simulation", "reports"},
    "client_app": {"server_app", "simulation", "reports", "strategies"},
    "strategies": {"server_app", "simulation", "reports", "client_app"},
    "protocol": {"server_app", "simulation", "reports", "client_app", "strategies"},
    "models": {"server_app", "simulation", "reports", "client_app", "strategies"},
    "federated_data": {"server_app", "simulation", "reports", "client_app", "strategies"},
    "simulation": {"reports"},
}
#: part -> the modules of a forbidden part it may still import: a strategy reads its client role's
#: arguments (the options its client reads, declared once there) and the array names they share
ALLOWED = {"strategies": ("client_app.roles",)}


def allowed(part: str, target: str) -> bool:
    return any(target == a or target.startswith(a + ".") for a in ALLOWED.get(part, ()))


def module_name(path: Path) -> str:
    """``server_app/runner.py`` -> ``server_app.runner`` (``pflower/cli.py`` -> ``pflower.cli``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _strip(name: str) -> str:
    """``pflower.server_app.runner`` -> ``server_app.runner``: the parts are pflower's subpackages
    (the package root's own modules, ``pflower.cli`` and ``pflower.compat``, keep their names)."""
    inside = name.split(".")[1] if name.startswith("pflower.") else ""
    return name.removeprefix("pflower.") if inside in PARTS else name


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The pflower modules ``path`` imports anywhere in its body, as names of :func:`module_name`."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                stem = ".".join([*base, *([node.module] if node.module else [])])
            else:
                stem = node.module or ""
            # ``from pkg import sub`` imports the module pkg.sub; ``from pkg import name``, pkg itself
            names = [f"{stem}.{a.name}" if _strip(f"{stem}.{a.name}") in modules else stem for a in node.names]
        else:
            continue
        for name in names:
            name = _strip(name)
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module_name(path):
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    files = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    modules = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, modules) for p in files}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_finder_sees_a_circle_and_lazy_imports(tmp_path):
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    graph = import_graph()
    assert "simulation.shared_trainer" in graph["simulation.batched"]  # a TYPE_CHECKING import is an edge
    assert "simulation.sim_command" in graph["pflower.cli"]  # so is one inside a function


def test_the_roots_shared_modules_import_no_part():
    """pflower.compat (other libraries' internals) and pflower.logs (log hygiene) sit under every
    part: both sides import them, they import none."""
    graph = import_graph()
    assert {m: t for m, t in graph.items() if m in ("pflower.compat", "pflower.logs")} == {
        "pflower.compat": set(),
        "pflower.logs": {"pflower.compat"},
    }


def test_no_import_circle():
    assert circles(import_graph()) == []


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_a_part_imports_only_the_parts_below_it(part):
    graph = import_graph()
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.split(".")[0] == part
        for target in targets
        if target.split(".")[0] in FORBIDDEN[part] and not allowed(part, target)
    )
    assert wrong == []


def test_simulation_is_the_one_part_that_imports_both_sides():
    graph = import_graph()
    both = {
        module.split(".")[0]
        for module, targets in graph.items()
        if {t.split(".")[0] for t in targets} >= {"server_app", "client_app"}
    }
    assert both <= {"simulation", "pflower"}, both


def test_the_server_app_folder_holds_what_the_server_app_does():
    lines = sum(len(p.read_text().splitlines()) for p in (ROOT / "server_app").glob("*.py"))
    # 2,500 until the runner's Ctrl-C handling and `pflower run`'s stop of a run (server_app/interrupt.py,
    # 300 lines with superlink.py's part) came in: neither an engine nor a report
    assert lines < 2900, f"server_app/ has {lines} lines: engines belong in simulation/, reports in reports/"


#: modules from the runner down: they take the resolved plan (server_app/run_plan.py), never the config
BELOW_THE_RUNNER = (
    "server_app/app.py",
    "server_app/runner.py",
    "server_app/superlink.py",
    "simulation/sim_command.py",
    "simulation/simulate.py",
    "simulation/together.py",
    "simulation/sweep_jobs.py",
    "simulation/inprocess.py",
    "simulation/parallel.py",
    "simulation/batched.py",
    "simulation/shared_trainer.py",
)


def _reads_a_config(path: Path) -> list[str]:
    """Where ``path`` reads a composed config: an omegaconf import, or a key of a name ``cfg``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if any(n and n.split(".")[0] == "omegaconf" for n in names):
                found.append(f"{path.name}:{node.lineno} imports omegaconf")
        elif isinstance(node, (ast.Attribute, ast.Subscript)):
            if isinstance(node.value, ast.Name) and node.value.id == "cfg":
                found.append(f"{path.name}:{node.lineno} reads cfg")
    return found


@pytest.mark.parametrize(
    "place", [*BELOW_THE_RUNNER, "strategies", "client_app", "models", "protocol", "federated_data"]
)
def test_below_the_runner_nothing_reads_the_composed_config(place):
    target = ROOT / place
    files = [target] if target.is_file() else sorted(target.rglob("*.py"))
    assert [hit for f in files for hit in _reads_a_config(f)] == []


#: where a composed config may be a parameter: its composition and its resolution into a plan
COMPOSITION = ("server_app/config.py", "server_app/run_plan.py")


def test_no_function_outside_the_composition_takes_a_dictconfig():
    """Overrides become a run through one function (run_plan.plan_run); no signature elsewhere
    takes a composed config or a union with one."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        # not the tests, the docs, a virtual environment or a build's copies of the code (build/lib/)
        if rel.startswith(("tests/", "docs/", "build/")) or "/." in f"/{rel}" or rel in COMPOSITION:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                annotations = [a.annotation for a in (*node.args.args, *node.args.kwonlyargs) if a.annotation]
                if any(
                    "DictConfig" in ast.unparse(a) for a in [*annotations, *([node.returns] if node.returns else [])]
                ):
                    found.append(f"{rel}:{node.lineno} {node.name}")
    assert found == []


def test_the_plan_is_frozen_and_the_engines_take_it():
    import dataclasses

    from pflower.server_app.run_plan import EngineSettings, RunPlan, RunSettings

    for cls in (RunPlan, RunSettings, EngineSettings):
        assert cls.__dataclass_params__.frozen, cls
    simulate = ast.parse((ROOT / "simulation" / "simulate.py").read_text())
    engine_fn = next(n for n in ast.walk(simulate) if isinstance(n, ast.FunctionDef) and n.name == "_simulate")
    assert [a.arg for a in engine_fn.args.args] == ["prepared", "sweep"]  # the prepared run and its plan, no cfg
    assert {f.name for f in dataclasses.fields(RunPlan)} >= {"run", "engine", "data", "archs", "options"}
