"""server_app.flwr_cli: `flwr` with a FAB build that does not enter ignored folders, and the same
FAB as Flower's own build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_files
from flwr.cli.utils import collect_files

from pflower.server_app.flwr_cli import collect_app_files

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "walkdemo"
version = "1.0.0"
dependencies = ["flwr>=1.42"]

[tool.flwr.app]
publisher = "demo"

[tool.flwr.app.components]
serverapp = "pkg.app:server"
clientapp = "pkg.app:client"

[tool.flwr.app.config]
rounds = 1
"""


def make_app(root: Path) -> None:
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / ".gitignore").write_text(".venv/\nbuild/\nresults/**/big/\n*.log\n")
    for rel in (
        "pkg/app.py",  # in the FAB
        "pkg/conf/a.yaml",
        "notes.md",
        ".venv/lib/site.py",  # an ignored folder: not entered
        "build/lib/pkg/app.py",
        "results/run1/big/x.json",
        "results/run1/summary.json",  # its sibling folder is ignored, it is not
        "pkg/debug.log",  # an ignored file in a folder that is walked
    ):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {rel}\n")
    (root / "link.py").symlink_to(root / "pkg" / "app.py")  # Flower skips symlinks; so does the walk


def test_the_walk_skips_ignored_folders_and_builds_flowers_own_fab(tmp_path):
    make_app(tmp_path)
    ours, flowers = collect_app_files(tmp_path), collect_files(tmp_path.resolve())
    assert not any(k.startswith((".venv/", "build/", "results/run1/big/")) for k in ours)
    assert {"pkg/app.py", "results/run1/summary.json", "pkg/debug.log"} <= set(ours) and "link.py" not in ours
    assert ".venv/lib/site.py" in flowers  # Flower visits it, then its filter drops it
    assert build_fab_from_files(ours)[0] == build_fab_from_files(flowers)[0]


def test_an_app_without_gitignore_is_walked_whole(tmp_path):
    make_app(tmp_path)
    (tmp_path / ".gitignore").unlink()
    assert set(collect_app_files(tmp_path)) == set(collect_files(tmp_path.resolve()))


@pytest.mark.heavy  # Flower's walk of this checkout (its .venv, when there is one: about 6 s)
def test_this_project_s_fab_is_the_one_flwr_builds():
    assert build_fab_from_files(collect_app_files(ROOT))[0] == build_fab_from_files(collect_files(ROOT))[0]


def test_the_module_is_flwr_s_command_line():
    out = subprocess.run(
        [sys.executable, "-m", "pflower.server_app.flwr_cli", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "Flower version" in out.stdout
