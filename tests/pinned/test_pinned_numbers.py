"""Every method's numbers are pinned: a short run must write exactly what ``pinned_numbers.json`` holds.

A change that moves a method's numbers on purpose regenerates the file in the same commit
(``python -m tests.pinned.cases --update <case>``) and says why in its message.
"""

from __future__ import annotations

import pytest

from pinned.cases import CASES, first_difference, load_pinned, run_case

PINNED = load_pinned()


def test_every_method_has_a_pinned_case():
    from pflower.strategies import STRATEGIES
    from pinned.cases import method_of

    assert set(STRATEGIES) <= {method_of(c) for c in CASES}, (
        "a method without a pinned case: add it to tests/pinned/cases.py"
    )
    assert set(PINNED) == set(CASES), (
        "pinned_numbers.json and CASES disagree: run python -m tests.pinned.cases --update"
    )


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_numbers_equal_the_pinned_ones(case):
    diff = first_difference(PINNED[case], run_case(case))
    assert diff is None, (
        f"{case}: the numbers moved, first at {diff}. If the change is meant to move them, run "
        f"`python -m tests.pinned.cases --update {case}` and say why in the commit message"
    )


def test_a_moved_number_is_named():
    pinned = {"rounds": [{"round": 1, "test_before_acc": 0.5, "clients": [0, 2]}], "summary": {"final_acc": 0.75}}
    assert first_difference(pinned, pinned) is None
    moved = {"rounds": [{"round": 1, "test_before_acc": 0.5 + 1e-6, "clients": [0, 2]}], "summary": {"final_acc": 0.75}}
    assert first_difference(pinned, moved) == "rounds[0].test_before_acc: 0.5 -> 0.500001"
    assert first_difference(pinned, {**pinned, "summary": {}}) == "summary.final_acc: missing now (was 0.75)"
    other = {"rounds": [{"round": 1, "test_before_acc": 0.5, "clients": [0, 3]}], "summary": {"final_acc": 0.75}}
    assert first_difference(pinned, other) == "rounds[0].clients[1]: 2 -> 3"
    assert first_difference({"x": 1.0}, {"x": 1.0 + 1e-13}) is None  # a last-bit difference of another CPU's kernels


def test_the_numerics_can_be_set_from_the_shell(monkeypatch):
    """`env $(python -m tests.pinned.numerics) pytest` (for an image whose pytest plugins import
    numpy first) sets exactly what apply() checks: one word per variable, no spaces."""
    import subprocess
    import sys
    from pathlib import Path

    from pinned import numerics

    root = Path(__file__).resolve().parents[2]
    words = subprocess.run(
        [sys.executable, "-m", "tests.pinned.numerics"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    assert dict(w.split("=", 1) for w in words) == numerics.PORTABLE
    for key, value in numerics.PORTABLE.items():
        monkeypatch.setenv(key, value)
    numerics.apply()  # numpy and torch are loaded here: set in the environment, it is not refused
    monkeypatch.setenv("MKL_CBWR", "AUTO")
    with pytest.raises(RuntimeError, match=r"env \$\(python -m tests.pinned.numerics\) pytest"):
        numerics.apply()
