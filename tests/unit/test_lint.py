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


#: radon's grades: A 1-5, B 6-10, C 11-20, D 21-30, E 31-40, F 41+ (branches a reader follows at once)
MOST_COMPLEX = 30


def test_no_block_outside_the_tests_is_more_complex_than_grade_d():
    """Every function and method outside tests/ at cyclomatic complexity 30 or less (radon's D):
    a block above it is split into named steps (issue 71 found three at 42-47)."""
    radon = pytest.importorskip("radon.complexity", reason="radon is not installed (pip install -e '.[test]')")
    too_complex = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("tests/", ".venv/", "build/", "docs/")) or "/." in f"/{rel}":
            continue
        blocks = radon.cc_visit(path.read_text())
        while blocks:  # a class's methods and a function's closures count on their own
            block = blocks.pop()
            blocks += [
                *getattr(block, "methods", ()),
                *getattr(block, "closures", ()),
                *getattr(block, "inner_classes", ()),
            ]
            if block.complexity > MOST_COMPLEX:
                too_complex.append(f"{rel}:{block.lineno} {block.name} ({block.complexity})")
    assert too_complex == []
