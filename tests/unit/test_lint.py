"""The linter and the formatter (ruff, configured in pyproject.toml: line length 120, pycodestyle,
pyflakes, import order) pass on the whole tree, so CI's `pytest` fails on a finding. Fix with
`ruff check --fix . && ruff format .`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def ruff() -> list[str]:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")
    return [found]


def test_ruff_check_passes():
    proc = subprocess.run([*ruff(), "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_ruff_format_leaves_every_file_as_it_is():
    proc = subprocess.run([*ruff(), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
