"""docs/claims.md is generated from conf/claims.yaml and the committed runs, and stays in step."""

from __future__ import annotations

import json

import pytest

from pflower.reports import claims
from pflower.server_app.config import ConfigError


def test_the_committed_page_is_what_the_declared_claims_and_runs_give():
    assert claims.main(["check"]) == 0, "run `pflower claims write` (or fix conf/claims.yaml)"


def test_a_committed_run_without_provenance_is_found(tmp_path):
    """Issue 74 (6): `pflower claims check` fails on a committed run with no provenance.json."""
    for name, with_provenance in (("a", True), ("b", False)):
        run_dir = tmp_path / "docs" / "results" / "set" / name
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text("{}")
        if with_provenance:
            (run_dir / "provenance.json").write_text('{"git_commit": null}')
    assert claims.runs_without_provenance(tmp_path) == [tmp_path.joinpath("docs/results/set/b").relative_to(tmp_path)]
    assert claims.runs_without_provenance(claims.ROOT) == []  # every committed run here has one


def run(root, name: str, seed: int = 42, **summary: float) -> None:
    path = root / "runs" / name
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "config.yaml").write_text(f"seed: {seed}\n")


def test_the_rules_give_their_verdicts_from_the_runs(tmp_path):
    run(tmp_path, "a-s1", seed=1, headline_test_before_acc=0.90)
    run(tmp_path, "a-s2", seed=2, headline_test_before_acc=0.92)
    run(tmp_path, "a-s3", seed=3, headline_test_before_acc=0.91)
    run(tmp_path, "b-s1", seed=1, headline_test_before_acc=0.95, total_mib_up=12.5)
    close = {"id": "X-1", "paper_value": 92.4, "rule": {"kind": "value", "runs": "runs/a-*"}}
    verdict, reason, numbers = claims.judge(close, tmp_path)
    assert verdict == "reproduced" and reason.startswith("-1.40 points")  # mean 91.0 +- 1.0 over 3 runs
    assert (numbers[0].mean, round(numbers[0].sd, 2), numbers[0].n) == (91.0, 1.0, 3)
    far = {**close, "rule": {**close["rule"], "tolerance": 1.0}}
    assert claims.judge(far, tmp_path)[0] == "not_reproduced"
    noted = {**close, "rule": {**far["rule"], "note": "the gap: see there"}}
    assert claims.judge(noted, tmp_path)[:2] == (
        "not_reproduced",
        "-1.40 points from the paper's 92.4 (tolerance 1; the mean of 3 runs); the gap: see there",
    )
    # issue 74 (2): `value` has the seed minimum of every rule, inside the tolerance or not
    two = {**close, "rule": {"kind": "value", "runs": "runs/a-s[12]"}}
    verdict, reason = claims.judge(two, tmp_path)[:2]
    assert verdict == "untested" and reason.endswith("the mean of 2 runs); rests on 2 seed(s), the rule needs 3")
    # ... and so has `values`: every item the mean of 3 seeds
    items = [
        {"label": "A", "paper_value": 91.0, "runs": "runs/a-*"},
        {"label": "B", "paper_value": 95.0, "runs": "runs/b-*"},
    ]
    verdict, reason = claims.judge({"id": "X-5", "rule": {"kind": "values", "items": items}}, tmp_path)[:2]
    assert verdict == "untested" and reason.endswith("; B rest(s) on fewer than 3 seeds")
    verdict = claims.judge({"id": "X-6", "rule": {"kind": "values", "items": items[:1]}}, tmp_path)[0]
    assert verdict == "reproduced"
    above = {"id": "X-2", "rule": {"kind": "above", "runs": "runs/a-*", "others": {"B": "runs/b-*"}}}
    verdict, reason = claims.judge(above, tmp_path)[:2]  # one shared seed (1): untested, whatever its sign
    assert verdict == "untested" and reason.startswith("this method minus the strongest of the 1 others (B): -5.00")
    assert "rests on 1 seed(s), the rule needs 3 (seeds run: 1, 2, 3; 1; 3 shared needed)" in reason
    # a one-seed lead at least 4 seed spreads wide may stand, the spread shown (90, 90.5, 91: 0.5)
    for k, acc in enumerate((0.90, 0.91, 0.92)):
        run(tmp_path, f"spread-s{k}", seed=k, headline_test_before_acc=acc - 0.005 * k)
    wide = {"id": "X-3", "rule": {**above["rule"], "runs": "runs/b-*", "others": {"A": "runs/a-s1"}}}
    wide["rule"]["spread"] = {"label": "A", "runs": "runs/spread-*"}
    verdict, reason = claims.judge(wide, tmp_path)[:2]
    assert verdict == "reproduced" and "5.00 points is 10 seed spreads of A (0.50 over 3 seeds)" in reason
    mib = {
        "id": "X-4",
        "rule": {
            "kind": "judged",
            "verdict": "partly",
            "reason": "r",
            "metric": "total_mib_up",
            "numbers": [{"label": "B", "runs": "runs/b-*"}],
        },
    }
    assert claims.judge(mib, tmp_path)[2][0].mean == 12.5  # not an accuracy: not scaled to percent


@pytest.mark.parametrize(
    "claim, message",
    [
        ({"id": "X", "paper_value": 1, "rule": {"kind": "value", "runs": "runs/none-*"}}, "no finished run matches"),
        ({"id": "X", "rule": {"kind": "judged", "verdict": "maybe", "reason": "r"}}, "judged verdict 'maybe'"),
        ({"id": "X", "rule": {"kind": "guess"}}, "rule kind 'guess'"),
    ],
)
def test_a_declaration_that_cannot_be_judged_names_the_claim_and_the_fix(tmp_path, claim, message):
    with pytest.raises(ConfigError, match=message):
        claims.judge(claim, tmp_path)


def test_a_series_metric_is_read_from_the_runs_rounds(tmp_path):
    run(tmp_path, "felo", final_acc=0.5)
    rounds = [{"round": r, **({"global_acc": r / 100} if r % 3 == 0 else {})} for r in range(1, 31)]
    (tmp_path / "runs" / "felo" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rounds))
    half = claims.measure("runs/felo", "global_acc@second_half", "Felo", tmp_path)
    assert round(half.mean, 6) == 24.0  # rounds 18, 21, 24, 27, 30: the evaluations after round 15
    assert claims.measure("runs/felo", "global_acc@final", "Felo", tmp_path).mean == 30.0
    with pytest.raises(ConfigError, match="logs no 'cvae_loss'"):
        claims.measure("runs/felo", "cvae_loss@final", "Felo", tmp_path)
    # how noisy a curve is: after round 15 the logged values 0.18, 0.21, ..., 0.30 step by 0.03
    assert claims.measure("runs/felo", "global_acc@jitter_second_half", "Felo", tmp_path).mean == pytest.approx(3.0)
    zigzag = [{"round": r, "test_before_acc": 0.5 + (0.1 if r % 2 else 0.0)} for r in range(1, 11)]
    (tmp_path / "runs" / "felo" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in zigzag))
    assert claims.measure("runs/felo", "test_before_acc@jitter_second_half", "Felo", tmp_path).mean == pytest.approx(
        10.0
    )


def test_a_list_of_globs_a_list_entry_and_a_round_window(tmp_path):
    run(tmp_path, "x1", cube=[0.25, 0.5])
    run(tmp_path, "y1", cube=[0.75, 1.0])
    rounds = [{"round": r, "acc": r / 10} for r in range(1, 11)]
    (tmp_path / "runs" / "x1" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rounds))
    assert claims.measure(["runs/x*", "runs/y*"], "cube[1]", "both", tmp_path).mean == 0.75
    assert claims.measure("runs/x1", "acc@rounds:6-8", "x", tmp_path).mean == pytest.approx(70.0)
    with pytest.raises(ConfigError, match=r"has no number 'cube\[5\]'"):
        claims.measure("runs/x1", "cube[5]", "x", tmp_path)


def test_fedtsdps_events_are_counted_from_its_summary(tmp_path):
    events = [
        {"round": 1, "shared_units": 18, "num_clusters": 3, "stage1_clusters": 3},
        {"round": 9, "shared_units": 16, "num_clusters": 5, "stage1_clusters": 4},
        {"round": 30, "shared_units": 16, "num_clusters": 5, "stage1_clusters": 5},
        {"round": 50, "shared_units": 12, "num_clusters": 6, "stage1_clusters": 6},
    ]
    run(tmp_path, "t", units=18)
    summary = {"units": 18, "reclusterings": events, "clusters": [[0, 1], [2]]}
    (tmp_path / "runs" / "t" / "summary.json").write_text(json.dumps(summary))
    got = {m: claims.measure("runs/t", f"derived:{m}", m, tmp_path).mean for m in claims.DERIVED}
    assert got == {
        "reclusterings": 4,
        "final_clusters": 2,
        "stage2_added_clusters": 1,  # round 9: 5 clusters from 4 stage-1 groups
        "first_stage1_clusters": 3,
        "max_stage1_clusters": 6,
        "layer_shrinks": 2,  # 18 -> 16 at round 9, 16 -> 12 at round 50
        "first_shrink_round": 9,
    }
    assert claims.Measured("rounds", 9.0, 0.0, 1).text() == "rounds **9** (1 run)"
    assert claims.Measured("units", 16.0, 0.0, 3).text() == "units **16** (3 runs, each)"
    assert claims.Measured("acc", 91.5, 0.5, 3).text() == "acc **91.50 ± 0.50** (3 runs)"
    with pytest.raises(ConfigError, match="unknown derived metric 'nope'"):
        claims.measure("runs/t", "derived:nope", "x", tmp_path)


def per_client_run(root, name: str, accs: dict[str, float]) -> None:
    path = root / "runs" / name
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({"final_client_acc": accs}))


def test_best_per_client_counts_clear_winners_and_gives_the_verdict(tmp_path):
    # clients 0-3; fc1 wins 0 and 1 clearly (by 5 and 2 points), fc2 wins 2 by 3 points, 3 is a near tie
    per_client_run(tmp_path, "fc1", {"0": 0.90, "1": 0.80, "2": 0.70, "3": 0.600})
    per_client_run(tmp_path, "fc2", {"0": 0.85, "1": 0.78, "2": 0.73, "3": 0.605})
    rule = {"kind": "best_per_client", "options": {"fc1": "runs/fc1", "fc2": "runs/fc2"}}
    verdict, reason, numbers = claims.judge({"id": "X", "rule": rule}, tmp_path)
    assert verdict == "reproduced"  # fc1 best for 2 of 4, fc2 for 1 of 4: both >= 10 %
    assert "of 4: fc1 2, fc2 1, no clear best 1" in reason
    assert numbers[0].text() == "fc1: mean client **75.00 ± 12.91** (4 clients)"
    strict = {**rule, "margin": 2.5}  # only client 0 (5 points) and client 2 (3 points) are clear
    assert "fc1 1, fc2 1, no clear best 2" in claims.judge({"id": "X", "rule": strict}, tmp_path)[1]
    assert claims.judge({"id": "X", "rule": {**rule, "min_share": 0.3}}, tmp_path)[0] == "partly"
    one_sided = {**rule, "margin": 4.0}  # only fc1's 5-point win on client 0 is left
    assert claims.judge({"id": "X", "rule": one_sided}, tmp_path)[0] == "not_reproduced"


def test_an_exact_tie_has_no_best_option_even_at_margin_zero():
    counts = claims.best_per_client({"a": {"0": 90.0, "1": 80.0}, "b": {"0": 90.0, "1": 79.5}}, margin=0.0)
    assert counts == {"a": 1, "b": 0, "": 1}


def test_best_per_client_averages_an_options_runs_and_names_a_run_without_per_client_numbers(tmp_path):
    per_client_run(tmp_path, "a-s1", {"0": 0.5, "1": 0.9})
    per_client_run(tmp_path, "a-s2", {"0": 0.7, "1": 0.9, "2": 0.1})  # client 2 only here: left out
    assert claims.client_accuracies("runs/a-*", tmp_path) == pytest.approx({"0": 60.0, "1": 90.0})
    run(tmp_path, "old", headline_test_before_acc=0.9)
    with pytest.raises(ConfigError, match="has no final_client_acc"):
        claims.client_accuracies("runs/old", tmp_path)


def test_the_paired_kinds_read_seeds_from_the_runs_and_decide_by_one_procedure(tmp_path):
    """compare, trend, ratio, count and shape through judge() on hand-made runs (three seeds)."""
    for seed, (a, b) in enumerate(((0.910, 0.900), (0.921, 0.910), (0.909, 0.900)), start=1):
        run(tmp_path, f"a-{seed}", seed=seed, headline_test_before_acc=a, total_mib_down=40.0, splits=2)
        run(tmp_path, f"b-{seed}", seed=seed, headline_test_before_acc=b, total_mib_down=100.0, splits=0)
    compare = {"kind": "compare", "a": {"label": "A", "runs": "runs/a-*"}, "b": {"label": "B", "runs": "runs/b-*"}}
    verdict, reason, numbers = claims.judge({"id": "C", "rule": compare}, tmp_path)
    assert verdict == "reproduced" and reason.startswith("A minus B: +1.00 points [+0.75, +1.25] (3 seeds)")
    assert claims.judge({"id": "C", "rule": {**compare, "margin": 2}}, tmp_path)[0] == "not_reproduced"
    assert claims.judge({"id": "C", "rule": {**compare, "setting": "s"}}, tmp_path)[0] == "partly"
    saved = {**compare, "kind": "ratio", "metric": "total_mib_down", "margin": 0.5}
    assert claims.judge({"id": "R", "rule": saved}, tmp_path)[:2][0] == "reproduced"  # 60 % saved on each seed
    count = {"kind": "count", "label": "A", "runs": "runs/a-*", "metric": "splits", "expected": 2}
    assert claims.judge({"id": "N", "rule": count}, tmp_path)[0] == "reproduced"
    trend = {
        "kind": "trend",
        "direction": "rises",
        "sweep": [{"x": 0, "label": "B", "runs": "runs/b-*"}, {"x": 1, "label": "A", "runs": "runs/a-*"}],
    }
    assert claims.judge({"id": "T", "rule": trend}, tmp_path)[0] == "reproduced"
    assert claims.judge({"id": "T", "rule": {**trend, "direction": "falls"}}, tmp_path)[0] == "not_reproduced"
    shape = {
        "kind": "shape",
        "a": {"label": "A", "runs": "runs/a-*"},
        "b": {"label": "B", "runs": "runs/b-*"},
        "windows": [{"label": "end", "direction": "higher"}, {"label": "mirror", "direction": "lower"}],
    }
    verdict, reason, _ = claims.judge({"id": "S", "rule": shape}, tmp_path)
    assert verdict == "partly" and reason.startswith("end (A minus B) +1.00 points")
    run(tmp_path, "a-dup", seed=1, headline_test_before_acc=0.5)
    with pytest.raises(ConfigError, match="two runs of seed 1 match"):
        claims.judge({"id": "C", "rule": compare}, tmp_path)


def test_no_judged_reason_holds_a_typed_number():
    """Issue 59: a judged verdict carries no typed number (its numbers come from runs), and says why
    no rule expresses it; `pflower claims check` refuses one that does."""
    data = claims.load_claims()
    assert claims.lint(data) == []
    bad = {"claims": [{"id": "X-1", "rule": {"kind": "judged", "verdict": "partly", "reason": "0.71 above"}}]}
    assert claims.lint(bad) == ["X-1: a judged reason holds a typed number (0.71): state it by a rule or drop it"]
