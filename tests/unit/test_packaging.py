"""conf/ must ship with a wheel and a FAB, so every way of running finds the same configs."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONF_FILES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "conf").rglob("*.yaml"))


def test_fab_holds_every_conf_file_and_stays_small(tmp_path):
    subprocess.run([str(BIN / "flwr"), "build", "--app", str(ROOT)], cwd=tmp_path, check=True, capture_output=True)
    fab = next(tmp_path.glob("*.fab"))
    names = set(zipfile.ZipFile(fab).namelist())
    assert set(CONF_FILES) <= names
    assert {"server_app/app.py", "client_app/app.py", "strategies/base.py", "models/layered.py"} <= names
    assert fab.stat().st_size < 8 * 2**20  # flwr refuses FABs over 10 MB (docs/results is excluded)


@pytest.mark.slow
def test_wheel_holds_every_conf_file(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    names = set(zipfile.ZipFile(next(tmp_path.glob("pflower-*.whl"))).namelist())
    assert set(CONF_FILES) <= names


def test_conf_dir_is_found_from_the_package():
    from server_app.config import conf_dir

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
