"""docs/adding-a-method.md, followed as a user would: a throwaway method added in a copy of the
repository with exactly the files the page's checklist names, then the suite's method checks run
there. A check that counts methods, or a step the page leaves out, fails here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from repo_copy import copy_repository

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "adding-a-method.md"

# the page's FedProx example, renamed (step 1): its option is its client's (the proximal role's)
STRATEGY = '''"""A throwaway method: FedProx under another name, written as docs/adding-a-method.md shows."""

from __future__ import annotations

from pflower.client_app.roles.proximal import ProximalArgs

from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy


class FedThrow(PersonalizedStrategy):
    """A throwaway method: FedProx under another name."""

    name, options_type = "fedthrow", ProximalArgs
    traits = MethodTraits(role="proximal")
'''
YAML = "defaults:\n  - /method_options/fedthrow@_here_\n  - _self_\n\nname: fedthrow\n"  # step 2
OWN_TEST = """from pflower.strategies import STRATEGIES


def test_fedthrow_is_registered_with_its_option():
    assert STRATEGIES["fedthrow"].options_type().mu == 1.0
"""  # step 3


@pytest.mark.slow
def test_a_method_added_as_the_page_says_passes_the_method_checks(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout (git ls-files)")
    page = PAGE.read_text()
    for step in (
        "strategies/<name>.py",
        "conf/method/<name>.yaml",
        "tests/unit/test_<name>.py",
        "tests/pinned/cases.py",
        "python -m tests.pinned.cases --update <name>",
        "pflower methods --write-docs",
    ):
        assert step in page, f"the page's checklist lost {step!r}"
    assert "self.mu" not in page, "FedProx has no attribute mu: the page must use self.options.mu"
    repo = copy_repository(tmp_path / "repo")
    (repo / "strategies" / "fedthrow.py").write_text(STRATEGY)
    (repo / "conf" / "method" / "fedthrow.yaml").write_text(YAML)
    (repo / "tests" / "unit" / "test_fedthrow.py").write_text(OWN_TEST)
    cases = repo / "tests" / "pinned" / "cases.py"  # step 4: one line in CASES, then --update
    text = cases.read_text()
    anchor = '    "fedprox": [],\n'
    assert anchor in text
    cases.write_text(text.replace(anchor, anchor + '    "fedthrow": [],\n', 1))
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONDONTWRITEBYTECODE": "1"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=600)

    updated = run("-m", "tests.pinned.cases", "--update", "fedthrow")
    assert updated.returncode == 0, updated.stdout[-2000:] + updated.stderr[-2000:]
    docs = run("-m", "pflower.cli", "methods", "--write-docs")  # step 5
    assert docs.returncode == 0, docs.stdout[-2000:] + docs.stderr[-2000:]
    checks = run(
        "-m",
        "pytest",
        "-q",
        "-n",
        "0",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "tests/unit/test_fedthrow.py",
        "tests/unit/test_method_declarations.py",
        "tests/unit/test_protocol.py",
        "tests/pinned/test_pinned_numbers.py",
        "-k",
        "not test_numbers_equal_the_pinned_ones or fedthrow",
    )
    assert checks.returncode == 0, checks.stdout[-4000:] + checks.stderr[-2000:]
    assert " passed" in checks.stdout and "failed" not in checks.stdout.splitlines()[-1]
    assert "fedthrow" in run("-m", "pflower.cli", "methods").stdout


# ----------------------------------------------------------------------------- the worked example
WORKED = "fedrod"
WORKED_FILES = ("strategies/fedrod.py", "client_app/roles/fedrod.py", "conf/method/fedrod.yaml")
CODE = (
    "server_app",
    "simulation",
    "strategies",
    "client_app",
    "models",
    "protocol",
    "federated_data",
    "reports",
    "conf",
)


def worked_section() -> str:
    page = PAGE.read_text()
    return page.split("## A worked example: FedRoD", 1)[1].split("\n## ", 1)[0]


def test_every_block_of_the_worked_example_is_in_the_file_it_names():
    """Each ``# <path>`` code block of the FedRoD walk-through holds lines of that file, in order."""
    blocks = [b.split("```", 1)[0] for b in worked_section().split("```python\n")[1:]]
    assert len(blocks) >= 4
    for block in blocks:
        header, *lines = block.rstrip("\n").splitlines()
        path = ROOT / header.removeprefix("# ").strip()
        assert header.startswith("# ") and path.is_file(), header
        text = path.read_text()
        assert "\n".join(lines) in text, f"docs/adding-a-method.md quotes {path.name} as it no longer is"


def test_the_worked_example_counts_its_lines_and_no_other_code_names_it():
    section = worked_section()
    for rel in (*WORKED_FILES, "tests/unit/test_fedrod.py"):
        lines = len((ROOT / rel).read_text().splitlines())
        if not rel.startswith("tests/"):
            assert f"`{rel}` ({lines} lines)" in section, (rel, lines)
    naming = sorted(
        path.relative_to(ROOT).as_posix()
        for part in CODE
        for path in (ROOT / part).rglob("*")
        if path.is_file() and path.suffix == ".py" and WORKED in path.read_text().lower()
    )
    # no registry, list or table of the code to edit (an experiment or the leaderboard may name it later)
    assert naming == sorted(f for f in WORKED_FILES if f.endswith(".py")), naming
    from pflower.reports.methods_cli import page_of

    assert page_of(WORKED) == "methods/fedrod.md"  # its page, found by name
    assert f'"{WORKED}": [' in (ROOT / "tests" / "pinned" / "cases.py").read_text()
