"""conf/ must ship with a wheel and a FAB, so every way of running finds the same configs."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONF_FILES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "conf").rglob("*.yaml"))


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_fab_holds_every_conf_file_and_stays_small(tmp_path):
    subprocess.run([str(BIN / "flwr"), "build", "--app", str(ROOT)], cwd=tmp_path, check=True, capture_output=True)
    fab = next(tmp_path.glob("*.fab"))
    names = set(zipfile.ZipFile(fab).namelist())
    assert set(CONF_FILES) <= names
    assert {
        "pflower/__init__.py",
        "server_app/app.py",
        "client_app/app.py",
        "strategies/base/strategy.py",
        "models/layered.py",
    } <= names
    assert fab.stat().st_size < 8 * 2**20  # flwr refuses FABs over 10 MB (docs/results is excluded)


def _build_wheel(dest: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dest), str(ROOT)],
        check=True,
        capture_output=True,
    )
    return next(dest.glob("pflower-*.whl"))


@pytest.mark.slow
def test_the_wheel_installs_one_import_name_beside_a_users_models_and_strategies(tmp_path):
    """`pip install` adds `pflower` (and its console scripts) and no other top-level name: a user's
    own `models` and `strategies` packages still import, and pflower runs a 2-round simulation from
    the installed copy (its provenance says so)."""
    import pflower

    wheel = _build_wheel(tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"pflower", wheel.name.split("-py")[0] + ".dist-info"}
    assert {f"pflower/{name}" for name in CONF_FILES} <= set(names)
    sources = {
        f"pflower/{p.relative_to(ROOT)}" for part in pflower.PARTS for p in (ROOT / part).rglob("*.py")
    }  # every module of every part, so a subpackage missing from pyproject's list fails here
    assert sources <= set(names), sorted(sources - set(names))[:5]

    # an in-process Ray simulation earlier in this worker leaves PYTHONPATH = its sys.path (flwr's
    # Ray backend sets it for its actors), which would put this checkout before the wheel
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, env=clean)
    site = next(venv.glob("lib/python*/site-packages"))
    # the dependencies (torch, flwr...) from this environment's site-packages; its .pth files
    # (pflower's editable finder among them) are not read from a directory a .pth line adds, but
    # its pflower metadata is seen: --ignore-installed installs the wheel anyway
    (site / "deps.pth").write_text(next(p for p in map(Path, sys.path) if p.name == "site-packages").as_posix())
    before = {p.name for p in site.iterdir()}
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--ignore-installed",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        env=clean,
    )
    added = {p.name for p in site.iterdir()} - before
    assert added == {"pflower", wheel.name.split("-py")[0] + ".dist-info"}, added

    user = tmp_path / "user"
    for name in ("models", "strategies"):
        (user / name).mkdir(parents=True)
        (user / name / "__init__.py").write_text(f"WHO = 'the user\\'s {name}'\n")
    out = tmp_path / "out"
    script = f"""
import json, pathlib, models, strategies
assert models.WHO == "the user's models" and strategies.WHO == "the user's strategies"
from pflower.cli import main
code = main(["sim", "dataset=digits", "num_clients=4", "rounds=2", "local_epochs=1", "backend=serial",
             "method=fedper", "progress=false", "output_dir={out}"])
assert code in (0, None), code
prov = json.loads(next(pathlib.Path({str(out)!r}).rglob("provenance.json")).read_text())
print(prov["code_from"], prov["code_root"])
"""
    run = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script], cwd=user, capture_output=True, text=True, timeout=600, env=clean
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-2:] == ["installed", str(site / "pflower")]
    assert list(out.rglob("summary.json"))


def test_conf_dir_is_found_from_the_package():
    from pflower.server_app.config import conf_dir

    assert (conf_dir() / "config.yaml").exists()


def test_no_shipped_file_points_at_the_developers_shared_folder():
    """Users get the repository, not the developers' ../shared folder (papers, specs): no code,
    config or doc of the project may send them there (cite the paper by title instead)."""
    shipped = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not shipped:
        pytest.skip("not a git checkout")
    offenders = []
    for name in shipped:
        if Path(name).suffix not in {".py", ".yaml", ".yml", ".md", ".toml", ".txt", ".cfg", ""} or name.startswith(
            "tests/unit/test_packaging"
        ):
            continue
        path = ROOT / name
        if path.is_file() and "../shared" in path.read_text(errors="replace"):
            offenders.append(name)
    assert not offenders, f"these files point at ../shared, which users do not have: {offenders}"
