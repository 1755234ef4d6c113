"""Shared fixtures: configs composed from conf/, an in-process Grid, small runs."""

from __future__ import annotations

import os

# One thread per process, in the processes the tests start too (Ray workers, SuperNodes, their
# ClientApps inherit the environment): pytest -n auto runs a worker per core, and two workers
# whose children each spin up a thread per core slow every test several times over.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# Numerics that give the same bits on every x86-64 CPU (tests/pinned/numerics.py): the pinned
# numbers are a property of the code, not of the machine CI happens to run on. Before numpy
# and torch load, in this process and the ones it starts.
from pinned import numerics  # noqa: E402  (standard library only)

numerics.apply()

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
numerics.disable_mkldnn()

# files whose tests start Ray (Flower's simulation engine, `flwr run`'s local simulation, a Ray
# cluster): never two Ray clusters at once. The other integration files run in-process or fork
# their own workers, and are units of their own.
ONE_AT_A_TIME = {
    f"tests/integration/{name}.py": "ray"
    for name in ("test_simulation", "test_ray_cluster", "test_examples", "test_resume_sim", "test_ctrl_c_ray")
}


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: its file (module fixtures such as a deployment cluster are
    built once; each deployment cluster has a file of its own), or the shared Ray unit
    (ONE_AT_A_TIME)."""
    path = nodeid.split("::", 1)[0]
    return ONE_AT_A_TIME.get(path, path)


# the longest work units first (seconds of one worker on a 2-core machine, docs/testing.md), so that
# no long unit starts last while the other worker idles; every other unit follows in collection order
LONGEST_FIRST = (
    "ray",
    "tests/e2e/test_deployment_methods.py",
    "tests/e2e/test_compose.py",
    "tests/e2e/test_deployment.py",
    "tests/e2e/test_deployment_netns.py",
    "tests/e2e/test_deployment_peers.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """``pytest -m quick``: every test that is neither ``slow`` (end-to-end processes) nor ``heavy``
    (a unit test over 1 s of one core): the quick tier (docs/testing.md says what it covers).
    The items are ordered longest work unit first (:data:`LONGEST_FIRST`; the same order on every
    worker, as xdist requires)."""
    for item in items:
        if not any(item.get_closest_marker(name) for name in ("slow", "heavy")):
            item.add_marker(pytest.mark.quick)
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(work_unit(item.nodeid), len(rank)), order[id(item)]))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``pytest -n auto`` (pyproject addopts): the workers share the cores and take whole work
    units (:func:`work_unit`). Our own scheduler, not ``--dist loadgroup``: pytest 9 keeps node
    ids where xdist 3.8's group marks no longer reach them (every test would be its own unit)."""
    from xdist.scheduler import LoadScopeScheduling

    # units in collection order (longest first, pytest_collection_modifyitems), not the most tests
    # first: the long deployment and Ray units start at once and the short unit files fill in
    config.option.loadscopereorder = False

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Deployed-node code paths cache partitions under $XDG_CACHE_HOME: never the user's own."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture
def compose(tmp_path):
    """compose(*overrides) -> the run's RunPlan (server_app.run_plan.plan_run) with outputs under tmp_path."""
    from pflower.server_app.run_plan import plan_run

    def _compose(*overrides: str):
        return plan_run([f"output_dir={tmp_path / 'outputs'}", *overrides])

    return _compose


@pytest.fixture
def tiny_overrides() -> list[str]:
    """A few seconds of training on synthetic data: for strategy and client tests."""
    return [
        "dataset=synthetic",
        "dataset.options.num_samples=600",
        "num_clients=4",
        "rounds=2",
        "fraction=0.5",
        "local_epochs=1",
        "partition.min_size=20",
        "alpha=1.0",
    ]


@pytest.fixture
def serverapp_identity():
    """What a ServerApp process has set before it builds a Message (Flower's TaskIdentity; the
    in-process grid sets the same)."""
    from pflower.compat import TaskIdentity

    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 0
