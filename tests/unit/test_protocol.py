"""What crosses the wire, defined once: the task spec, role arguments, and who imports whom."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pflower.client_app.roles import ROLES, build_role
from pflower.client_app.roles.base import SGDArgs
from pflower.client_app.roles.fedbabu import FedBabuArgs
from pflower.client_app.roles.proximal import ProximalArgs
from pflower.protocol import OptionError, RoleArgs, RoleArgsError, SpecError, TaskSpec

ROOT = Path(__file__).resolve().parents[2]
SPEC = dict(run="r", seed=1, model={"name": "lenet5"}, data={"dataset": "digits"}, train={"epochs": 1})


def test_task_spec_round_trips_and_names_what_is_wrong():
    spec = TaskSpec(**SPEC, personal=["classifier"], keep="model")
    assert TaskSpec.from_json(spec.to_json()) == spec
    with pytest.raises(SpecError, match="older pflower"):
        TaskSpec.from_dict({**SPEC, "brand_new_field": 1})
    with pytest.raises(SpecError, match="keep"):
        TaskSpec(**SPEC, keep="everything")
    with pytest.raises(SpecError, match="not JSON"):
        TaskSpec.from_json("{oops")
    with pytest.raises(SpecError, match="malformed"):
        TaskSpec.from_dict({"run": "r"})


def test_a_training_setting_the_client_does_not_know_is_refused_naming_the_update():
    from pflower.client_app.runtime import _train_args

    kept = TaskSpec(**{**SPEC, "train": {"epochs": 1, "optimizer_state": "kept"}})
    assert _train_args(kept).optimizer_state == "kept"
    with pytest.raises(SpecError, match=r"training setting\(s\) \['warp_speed'\] .*\(update pflower on the node\)"):
        _train_args(TaskSpec(**{**SPEC, "train": {"epochs": 1, "warp_speed": 9}}))


def test_role_arguments_are_checked_where_they_are_built_and_where_they_are_read():
    with pytest.raises(OptionError, match="mu"):
        ProximalArgs(mu=-1)
    with pytest.raises(OptionError, match="finetune_part"):
        FedBabuArgs(finetune_epochs=5, finetune_part="tail")
    with pytest.raises(RoleArgsError, match="unknown argument"):
        build_role("proximal", {"mu": 1.0, "nu": 2.0, "finetune_epochs": 0})
    with pytest.raises(RoleArgsError, match=r"role 'proximal': option mu must be >= 0"):
        build_role("proximal", {"mu": -1.0, "finetune_epochs": 0})
    with pytest.raises(ValueError, match="unknown client role"):
        build_role("nosuch", {})
    assert build_role("proximal", ProximalArgs(mu=0.5).wire()).args == ProximalArgs(mu=0.5)
    assert issubclass(ROLES["fedap"].args_type, SGDArgs)  # roles built on SGDRole may fine-tune before evaluating


def test_every_client_role_reads_arguments_declared_beside_it():
    assert all(issubclass(role.args_type, RoleArgs) for role in ROLES.values())
    assert all(role.args_type.__module__ == role.__module__ or role.args_type is SGDArgs for role in ROLES.values())


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_every_strategy_sends_arguments_its_role_accepts(compose, tiny_overrides):
    from pflower.server_app.runner import build
    from pflower.strategies import STRATEGIES

    for method in STRATEGIES:
        extra = {
            "fedcmd": ["method.kp=2", "rounds=4"],
            "fedcpmd": ["method.kp=2", "rounds=4"],
            "fedtsdp": ["dataset.public=holdout"],
            "fedmd": ["dataset.transfer_fraction=0.2", "method.subset=20"],
        }.get(method, [])
        strategy = build(compose(*tiny_overrides, f"method={method}", *extra), run_token="t")
        for rnd in (1, 3):
            spec = strategy.task_spec(0, rnd, "train")
            build_role(spec.role, spec.role_args)  # raises if the role would refuse them


def imports_of(path: Path) -> set[str]:
    """What ``path`` imports, named from the repository's parts (``pflower.client_app.x`` and a
    relative import that climbs to it both read ``client_app.x``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            out.add(".".join([*base, *([node.module] if node.module else [])]))
    return {m.removeprefix("pflower.") for m in out}


# the simulation engines host both sides in one process: they run the ClientApp's handlers
# (inprocess.py, parallel.py) or hand Flower the ClientApp object (simulate.py)
SIMULATION_HARNESS = {
    "simulation/inprocess.py",
    "simulation/parallel.py",
    "simulation/batched.py",
    "simulation/together.py",
    "simulation/simulate.py",
}
# benchmarks of the client's own training loop: one client at a time against the batched engine,
# and the Felo probe that trains one client's model with a fresh Adam against a kept one
CLIENT_BENCHMARKS = {"benchmarks/batched_profile.py", "benchmarks/authors/felo_adam_probe.py"}


@pytest.mark.parametrize(
    "side, forbidden",
    [
        ("server_app", "client_app"),
        ("protocol", "client_app"),
        ("models", "client_app"),
        ("federated_data", "client_app"),
        ("client_app", "strategies"),
        ("client_app", "server_app"),
        ("protocol", "strategies"),
        ("models", "strategies"),
        ("federated_data", "strategies"),
        ("federated_data", "server_app"),
    ],
)
def test_the_server_never_imports_client_code_and_the_client_never_imports_strategies(side, forbidden):
    """Module-level and function-level imports alike; both sides share protocol/, models/ and
    federated_data/ instead. The exceptions: the simulation engines, which host both sides, and a
    strategy reading its client role's arguments (below)."""
    bad = {
        str(p.relative_to(ROOT)): sorted(m for m in imports_of(p) if m == forbidden or m.startswith(forbidden + "."))
        for p in (ROOT / side).rglob("*.py")
        if str(p.relative_to(ROOT)) not in SIMULATION_HARNESS | CLIENT_BENCHMARKS
    }
    assert not {k: v for k, v in bad.items() if v}


def test_a_strategy_takes_from_the_client_side_only_its_roles_declarations():
    """strategies/ and benchmarks/ may import client_app.roles (the role's arguments, where the
    options its client reads are declared once, and the array names) and nothing else of it."""
    bad = {
        str(p.relative_to(ROOT)): sorted(
            m for m in imports_of(p) if m.startswith("client_app") and not m.startswith("client_app.roles")
        )
        for side in ("strategies", "benchmarks")
        for p in (ROOT / side).rglob("*.py")
        if str(p.relative_to(ROOT)) not in CLIENT_BENCHMARKS
    }
    assert not {k: v for k, v in bad.items() if v}


def test_the_simulation_harness_imports_only_the_client_entry_points():
    """What the exempt modules take from client_app: the handlers, the node state reader, the
    ClientApp object, the batched engine's client half (nothing else, so the exemption cannot
    grow unnoticed)."""
    allowed = {"client_app.runtime", "client_app.state", "client_app.app", "client_app.grouped_training"}
    used = {m for f in SIMULATION_HARNESS for m in imports_of(ROOT / f) if m.startswith("client_app")}
    assert used <= allowed, used - allowed


def test_the_data_layer_has_no_import_cycle():
    """Module-level and function-level imports alike (a lazy import inside a function is still a cycle)."""
    package = ROOT / "federated_data"
    graph: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names = [node.module] if node.module else [a.name for a in node.names]
                deps |= {n.split(".")[0] for n in names}
        graph[path.stem] = deps & {p.stem for p in package.glob("*.py")}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in graph[node]:
            assert state.get(dep) != 1, f"import cycle: {' -> '.join([*trail, node, dep])}"
            if dep not in state:
                visit(dep, [*trail, node])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [])
