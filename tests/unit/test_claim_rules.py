"""The claim rules (reports/claim_rules.py): each kind on hand-made per-seed numbers, hand-worked,
and shown able to return every verdict it can give (issue 59). t(0.975, 2) = 4.3027."""

from __future__ import annotations

import pytest

from pflower.reports import claim_rules as rules


def test_interval_by_hand():
    got = rules.interval([1.0, 2.0, 3.0])  # mean 2, sd 1: half-width 4.3027 / sqrt(3) = 2.4841
    assert (got.mean, got.n) == (2.0, 3) and got.low == pytest.approx(-0.4841, abs=1e-4)
    assert rules.interval([5.0]) == rules.Effect(5.0, 5.0, 5.0, 1)


@pytest.mark.parametrize(
    "a, b, direction, margin, setting, verdict",
    [
        ({1: 91.0, 2: 92.1, 3: 90.9}, {1: 90.0, 2: 91.0, 3: 90.0}, 1, None, False, "reproduced"),  # +1.0,+1.1,+0.9
        ({1: 91.0, 2: 92.1, 3: 90.9}, {1: 90.0, 2: 91.0, 3: 90.0}, 1, None, True, "partly"),  # another setting
        ({1: 91.0, 2: 90.0, 3: 90.9}, {1: 90.0, 2: 91.0, 3: 90.0}, 1, None, False, "partly"),  # +1, -1, +0.9
        ({1: 89.0, 2: 91.5, 3: 89.0}, {1: 90.0, 2: 91.0, 3: 90.0}, 1, None, False, "not_reproduced"),  # mean < 0
        ({1: 91.0, 2: 92.1, 3: 90.9}, {1: 90.0, 2: 91.0, 3: 90.0}, 1, 2.0, False, "not_reproduced"),  # 2 > [0.75, 1.25]
        ({1: 91.0, 2: 92.1, 3: 90.9}, {1: 90.0, 2: 91.0, 3: 90.0}, 1, 1.1, False, "reproduced"),  # 1.1 inside it
        ({1: 91.0, 2: 92.1, 3: 90.9}, {1: 90.0, 2: 91.0, 3: 90.0}, 1, 0.5, False, "partly"),  # 0.5 below all of it
        ({1: 91.0, 2: 92.1, 3: 90.9}, {1: 90.0, 2: 91.0, 3: 90.0}, -1, None, False, "not_reproduced"),  # paper: lower
        ({1: 91.0}, {1: 90.0}, 1, None, False, "untested"),  # one seed
        ({1: 91.0, 2: 92.0}, {3: 90.0}, 1, None, False, "untested"),  # no seed shared
    ],
)
def test_compare_returns_every_verdict(a, b, direction, margin, setting, verdict):
    assert rules.decide(rules.compare(a, b), direction, margin, other_setting=setting)[0] == verdict


def test_compare_is_paired_by_seed():
    effect = rules.compare({1: 91.0, 2: 92.1, 3: 90.9, 4: 50.0}, {1: 90.0, 2: 91.0, 3: 90.0})
    # diffs 1.0, 1.1, 0.9: mean 1.0, sd 0.1, half-width 4.3027 * 0.1 / sqrt(3) = 0.2484; seed 4 unpaired
    assert effect.n == 3 and effect.mean == pytest.approx(1.0) and effect.low == pytest.approx(0.7516, abs=1e-4)


def test_trend_is_each_seeds_slope_then_their_interval():
    # seed 1: 90, 91, 92 over x = 20, 40, 60 (slope 0.05); seed 2: 0.04; seed 3: 0.06
    sweep = {20: {1: 90.0, 2: 90.0, 3: 90.0}, 40: {1: 91.0, 2: 90.8, 3: 91.2}, 60: {1: 92.0, 2: 91.6, 3: 92.4}}
    effect = rules.trend(sweep)
    assert effect.n == 3 and effect.mean == pytest.approx(0.05)
    assert rules.decide(effect, 1)[0] == "reproduced"
    assert rules.decide(effect, -1)[0] == "not_reproduced"  # the paper: falls
    flat = {20: {1: 90.0, 2: 90.0, 3: 90.0}, 40: {1: 90.5, 2: 89.5, 3: 90.2}, 60: {1: 90.2, 2: 89.6, 3: 90.4}}
    assert rules.decide(rules.trend(flat), 1)[0] == "partly"  # slopes 0.005, -0.01, 0.01
    assert rules.decide(rules.trend({20: {42: 94.7}, 40: {42: 96.8}}), 1)[0] == "untested"
    assert rules.trend({20: {1: 1.0}, 40: {2: 1.0}}) is None  # no seed ran every point
    with pytest.raises(ValueError, match="two x values"):
        rules.trend({20: {1: 1.0}})


def test_ratio_is_the_share_saved():
    effect = rules.ratio({1: 40.0, 2: 40.0, 3: 40.0}, {1: 100.0, 2: 100.0, 3: 100.0})  # 60 % saved on each seed
    assert effect.mean == pytest.approx(0.6) and effect.low == pytest.approx(0.6)
    assert rules.decide(effect, 1, margin=0.6)[0] == "reproduced"  # the paper's 60 % inside the interval
    assert rules.decide(effect, 1, margin=0.5)[0] == "partly"  # 50 %: below the whole interval
    assert rules.decide(effect, 1, margin=0.7)[0] == "not_reproduced"  # the paper's 70 % above the interval
    assert rules.decide(rules.ratio({1: 120.0, 2: 110.0, 3: 130.0}, {1: 100.0, 2: 100.0, 3: 100.0}), 1)[0] == (
        "not_reproduced"
    )
    assert rules.decide(rules.ratio({1: 90.0, 2: 110.0, 3: 95.0}, {1: 100.0, 2: 100.0, 3: 100.0}), 1)[0] == "partly"
    assert rules.decide(rules.ratio({1: 40.0}, {1: 100.0}), 1)[0] == "untested"


@pytest.mark.parametrize(
    "fired, expected, tolerance, verdict",
    [
        ({1: 2, 2: 2, 3: 1}, 2, 0.5, "reproduced"),  # 1.67 within 0.5 of 2
        ({1: 7, 2: 6, 3: 8}, 2, 0.5, "partly"),  # fires, far too often
        ({1: 0, 2: 0, 3: 0}, 2, 0.5, "not_reproduced"),  # never fires
        ({1: 3, 2: 1, 3: 2}, 0, 0.5, "not_reproduced"),  # the paper: never; here on every seed
        ({1: 3, 2: 0, 3: 0}, 0, 0.5, "partly"),  # the paper: never; here on one seed of three
        ({1: 2}, 2, 0.5, "untested"),
    ],
)
def test_count_returns_every_verdict(fired, expected, tolerance, verdict):
    assert rules.decide_count(fired, expected, tolerance)[0] == verdict


def test_shape_holds_at_every_window_some_or_none():
    ahead = ({1: 91.0, 2: 92.1, 3: 90.9}, {1: 90.0, 2: 91.0, 3: 90.0})  # a above b on every seed
    mixed = ({1: 91.0, 2: 90.0, 3: 90.9}, {1: 90.0, 2: 91.0, 3: 90.0})
    behind = (ahead[1], ahead[0])
    assert rules.decide_shape(rules.shape([ahead, behind]), [1, -1])[0] == "reproduced"  # a leads, then trails
    assert rules.decide_shape(rules.shape([ahead, mixed]), [1, 1])[0] == "partly"
    assert rules.decide_shape(rules.shape([behind, behind]), [1, 1])[0] == "not_reproduced"
    assert rules.decide_shape(rules.shape([({1: 1.0}, {1: 0.0}), ahead]), [1, 1])[0] == "untested"
    # issue 74 (5): most windows against is not reproduced (2 of 3), half against stays partly (1 of 2)
    verdict, why = rules.decide_shape(rules.shape([behind, behind, ahead]), [1, 1, 1])
    assert (verdict, why) == ("not_reproduced", "the ordering goes against the paper at 2 of 3 windows")
    assert rules.decide_shape(rules.shape([behind, ahead]), [1, 1])[0] == "partly"


@pytest.mark.parametrize(
    "a, verdict",
    [
        ({1: 90.1, 2: 90.2, 3: 90.0}, "reproduced"),  # +0.1, +0.2, 0.0: [-0.15, +0.35] inside [-1, +0.7]
        ({1: 90.5, 2: 89.0, 3: 90.4}, "partly"),  # mean -0.03 inside, the interval reaches out
        ({1: 88.5, 2: 88.8, 3: 88.6}, "not_reproduced"),  # mean -1.37: outside the band
        ({1: 90.1}, "untested"),
    ],
)
def test_within_returns_every_verdict(a, verdict):
    b = {1: 90.0, 2: 90.0, 3: 90.0}
    assert rules.decide_within(rules.compare(a, b), -1.0, 0.7)[0] == verdict


@pytest.mark.parametrize(
    "fired, verdict",
    [({1: 2, 2: 1, 3: 5}, "reproduced"), ({1: 0, 2: 1, 3: 3}, "partly"), ({1: 0, 2: 0, 3: 0}, "not_reproduced")],
)
def test_count_at_least_for_a_mechanism_the_paper_gives_no_count_for(fired, verdict):
    assert rules.decide_count(fired, at_least=1)[0] == verdict


def test_a_rule_without_a_size_says_it_scored_the_direction_alone():
    effect = rules.compare({1: 91.0, 2: 92.1, 3: 90.9}, {1: 90.0, 2: 91.0, 3: 90.0})
    assert "direction alone" in rules.decide(effect, 1)[1] and "direction alone" not in rules.decide(effect, 1, 1.1)[1]


def test_a_window_s_size_above_its_interval_goes_against_the_shape():
    held = rules.compare({1: 91.0, 2: 92.1, 3: 90.9}, {1: 90.0, 2: 91.0, 3: 90.0})  # [0.75, 1.25]
    assert rules.decide_shape([held, held], [1, 1], margins=[1.0, 1.1])[0] == "reproduced"
    # FedCMD-8's case: one window's paper size (5.2 there, 2.0 here) above its whole interval
    assert rules.decide_shape([held, held, held], [1, 1, 1], margins=[1.0, 2.0, 1.1])[0] == "partly"
    assert rules.decide_shape([held, held], [1, 1], margins=[2.0, 2.0])[0] == "not_reproduced"


def test_runs_on_different_partitions_compare_unpaired_by_welch():
    # a: mean 2, variance 1 over 3 seeds; b: constant 0. se = sqrt(1/3), df = 2: half-width 4.3027 * 0.5774
    effect = rules.compare_unpaired({1: 1.0, 2: 2.0, 3: 3.0}, {7: 0.0, 8: 0.0, 9: 0.0})
    assert (effect.mean, effect.n) == (2.0, 3) and effect.low == pytest.approx(2.0 - 2.4841, abs=1e-4)
    assert rules.compare({1: 1.0, 2: 2.0, 3: 3.0}, {7: 0.0, 8: 0.0, 9: 0.0}) is None  # no seed pairs them
    assert rules.compare_unpaired({1: 1.0}, {}) is None
