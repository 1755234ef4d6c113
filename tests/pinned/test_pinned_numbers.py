"""Every method's numbers are pinned: a short run must write exactly what ``pinned_numbers.json`` holds.

A change that moves a method's numbers on purpose regenerates the file in the same commit
(``python -m tests.pinned.cases --update <case>``) and says why in its message.
"""

from __future__ import annotations

import pytest

from pinned.cases import CASES, first_difference, load_pinned, run_case

PINNED = load_pinned()


def test_every_method_has_a_pinned_case():
    from strategies import STRATEGIES

    from pinned.cases import method_of

    assert set(STRATEGIES) <= {method_of(c) for c in CASES}, "a method without a pinned case: add it to tests/pinned/cases.py"
    assert set(PINNED) == set(CASES), "pinned_numbers.json and CASES disagree: run python -m tests.pinned.cases --update"


@pytest.mark.parametrize("case", list(CASES))
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
