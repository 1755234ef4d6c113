"""`pflower leaderboard`: fixed places per (protocol, entry, seed), done runs skipped, stopped ones
resumed, every bad entry refused before anything runs, and a page whose numbers are the runs'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pflower.reports.leaderboard import (
    budget_line,
    load_plan,
    mark_ties,
    plan_jobs,
    protocol_rows,
    run_jobs,
    time_budget,
    verdict,
    write_page,
)
from pflower.server_app.config import ConfigError


def seed_row(entry: str, *values: float, planned: int | None = None) -> dict:
    """A leaderboard row of ``values`` (percent) on seeds 1, 2, ...: mean, sample std and the runs."""
    import statistics

    return {
        "entry": entry,
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "seeds": len(values),
        **({"planned": planned} if planned else {}),
        "runs": [{"seed": i + 1, "metric": v / 100} for i, v in enumerate(values)],
    }


TINY = [
    "dataset=digits",
    "num_clients=4",
    "fraction=1.0",
    "rounds=2",
    "local_epochs=1",
    "partition.min_size=20",
    "backend=serial",
    "alpha=1.0",
]


def tiny_plan(tmp_path: Path, entries: dict) -> tuple[dict, Path]:
    plan = {
        "out": str(tmp_path / "lb"),
        "metric": "headline_test_before_acc",
        "seeds": [1, 2],
        "one_seed": [1],
        "protocols": {"tiny": {"experiment": "smoke", "entries": "all"}},
        "entries": {"all": entries},
    }
    path = tmp_path / "leaderboard.yaml"
    path.write_text(yaml.safe_dump(plan))
    return load_plan(path), tmp_path / "lb"


def test_the_plan_places_every_run_and_refuses_what_it_does_not_know(tmp_path):
    plan, root = tiny_plan(
        tmp_path,
        {
            "fedavg": {"overrides": ["method=fedavg", *TINY]},
            "local": {"overrides": ["method=local", *TINY], "seeds": "one_seed"},
        },
    )
    jobs = plan_jobs(plan, root)
    assert [(j.entry, j.seed) for j in jobs] == [("fedavg", 1), ("fedavg", 2), ("local", 1)]
    assert jobs[1].root == root / "runs" / "tiny" / "fedavg" / "seed2" and jobs[1].status() == "new"
    assert "seed=2" in jobs[1].config() and "experiment=smoke" in jobs[1].config()
    with pytest.raises(ConfigError, match="unknown protocol"):
        plan_jobs(plan, root, ["nosuch"])
    bad = yaml.safe_load((tmp_path / "leaderboard.yaml").read_text())
    bad["protocols"]["tiny"]["experiment"] = "nosuch"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match="not in conf/experiment"):
        load_plan(tmp_path / "bad.yaml")


def test_a_bad_entry_stops_the_whole_plan_before_any_run(tmp_path):
    plan, root = tiny_plan(
        tmp_path, {"fedavg": {"overrides": ["method=fedavg", *TINY]}, "fedcmd": {"overrides": ["method=fedcmd", *TINY]}}
    )  # kp=20 >= 2 rounds
    with pytest.raises(ConfigError, match=r"(?s)2 leaderboard run\(s\) cannot start.*tiny/fedcmd/seed1: FedCMD kp=20"):
        run_jobs(plan_jobs(plan, root))
    assert not (root / "runs").exists()


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_runs_skip_what_is_done_resume_what_stopped_and_the_page_uses_their_numbers(tmp_path, capsys):
    plan, root = tiny_plan(
        tmp_path, {"fedavg": {"overrides": ["method=fedavg", *TINY]}, "local": {"overrides": ["method=local", *TINY]}}
    )
    jobs = plan_jobs(plan, root)
    run_jobs(jobs)
    assert [j.status() for j in jobs] == ["done"] * 4
    stopped = jobs[0].run_dir()
    (stopped / "summary.json").unlink()  # as if the process died after the last checkpoint
    capsys.readouterr()
    actions = [a for _, a in run_jobs(jobs)]
    assert actions == ["resume", "skip (done)", "skip (done)", "skip (done)"] and jobs[0].status() == "done"
    assert json.loads((stopped / "summary.json").read_text())["resumed_after_rounds"] == [2]

    page = write_page(plan, root, tmp_path / "docs" / "leaderboard.md")
    text = page.read_text()
    rows = protocol_rows(jobs, "headline_test_before_acc", {"fedavg": 2, "local": 2})
    accs = {j.entry: [] for j in jobs}
    for j in jobs:
        accs[j.entry].append(100 * json.loads((j.run_dir() / "summary.json").read_text())["headline_test_before_acc"])
    for row in rows:
        values = accs[row["entry"]]
        assert row["mean"] == pytest.approx(sum(values) / 2) and row["seeds"] == 2
        assert f"{row['mean']:.2f} ± {row['std']:.2f}" in text
    spent = sum(json.loads((j.run_dir() / "summary.json").read_text())["wall_time_s"] for j in jobs) / 3600
    assert f"Run time of the finished runs: {spent:.1f} h" in text and "unfinished" not in text
    assert time_budget([{"wall": 30.0}, {"wall": 90.0}], done=4, planned=10) == (120.0, 180.0)
    # a one-seed entry above the several-seed best is named, never the best
    lone = mark_ties([seed_row("solo", 99.0), seed_row("a", 95.0, 96.0, 94.0), seed_row("b", 94.0, 96.5, 93.0)])
    assert [r["entry"] for r in lone if r["best"]] == ["a"] and lone[2]["tie"]  # b - a: -1.0, +0.5, -1.0
    assert verdict(lone) == (
        "Best: **a**, 95.00 ± 1.00 over 3 seed(s). Above it on one seed only (no spread, so not a win): "
        "solo 99.00. Tied with it (the paired 95 % interval of the difference contains 0, so not a win either "
        "way): b."
    )
    assert "The 6 unfinished, at the mean of a finished run: about 3.0 h more." in budget_line(120.0, 180.0, 6)
    assert budget_line(120.0, 180.0, 36, unestimated=30).endswith(
        "The 36 unfinished, at the mean of a finished run: about 3.0 h more, not counting 30 of them on protocols "
        "with no finished run yet."
    )
    assert budget_line(120.0, 0.0, 30, unestimated=30).endswith(
        "The 30 unfinished are on protocols with no finished run yet: no estimate."
    )
    assert "4 of 4 planned runs finished" in text and verdict(rows).split("**")[1] == rows[0]["entry"] in text
    assert (
        root / "tiny_accuracy_vs_round.png"
    ).exists() and "![tiny_accuracy_vs_mib](../lb/tiny_accuracy_vs_mib.png)" in text
    assert "Read this" not in text
    plan["protocols"]["tiny"]["note"] = "Read this: the rows measure different models."
    plan["intro"] = "The set-up: 100 rounds."
    text = write_page(plan, root, tmp_path / "docs" / "leaderboard.md").read_text()
    assert "## tiny (`experiment=smoke`)\n\nRead this: the rows measure different models.\n\n4 of 4 planned" in text
    assert "the in-process engine).\n\nThe set-up: 100 rounds.\n\n" in text

    # a second metric's column: mean ± std over the seeds that wrote it, '-' for an entry without it
    for j in jobs:
        if j.entry == "fedavg":
            summary = json.loads((j.run_dir() / "summary.json").read_text())
            (j.run_dir() / "summary.json").write_text(json.dumps({**summary, "final_global_acc": 0.5 + 0.1 * j.seed}))
    plan["protocols"]["tiny"]["second_metric"] = {"key": "final_global_acc", "label": "global test, final"}
    text = write_page(plan, root, tmp_path / "docs" / "leaderboard.md").read_text()
    assert (
        "| entry | seeds | headline (mean ± std) | minus the best, paired (95 % CI) | global test, final "
        "| final (all clients) |" in text
    )
    mean = 100 * (0.5 + 0.1 * 1.5)
    std = 100 * 0.1 / 2**0.5
    assert f"| {mean:.2f} ± {std:.2f} |" in text
    local_line = next(line for line in text.splitlines() if line.startswith("| local"))
    assert local_line.split(" | ")[3] == "-"
    assert f"On the global test, final: best **fedavg**, {mean:.2f} ± {std:.2f} over 2 seed(s)." in text
    assert "Not measured by: local." in text

    # what each row measures, as a column; a method page's block gets the protocol's verdict and table
    plan["protocols"]["tiny"]["evaluated"] = {"fedavg": "the global model", "local": "each client's own model"}
    methods = tmp_path / "docs" / "methods"
    methods.mkdir()
    (methods / "m.md").write_text(
        "# m\n\nBefore.\n\n<!-- leaderboard:tiny -->\nold\n<!-- /leaderboard:tiny -->\nAfter.\n"
    )
    text = write_page(plan, root, tmp_path / "docs" / "leaderboard.md").read_text()
    assert "| entry | evaluated model | seeds |" in text
    assert next(line for line in text.splitlines() if line.startswith("| local")).split(" | ")[1] == (
        "each client's own model"
    )
    block = (methods / "m.md").read_text()
    assert block.startswith("# m\n\nBefore.\n\n<!-- leaderboard:tiny -->\nBest: **") and block.endswith(
        "<!-- /leaderboard:tiny -->\nAfter.\n"
    )
    assert "old" not in block and "| entry | evaluated model | seeds |" in block and "(../leaderboard.md)" in block
    plan["protocols"]["tiny"]["evaluated"] = {"nobody": "x"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(plan))
    with pytest.raises(ConfigError, match="unknown entries: \\['nobody'\\]"):
        load_plan(path)


def test_a_tie_is_a_paired_interval_over_shared_seeds_that_contains_zero():
    """Issue 59: a consistent gap is "behind" however much both entries swing from seed to seed, and
    an inconsistent one is a tie however steady either entry is (hand-worked: t(0.975, 2) = 4.303)."""
    rows = mark_ties(
        [
            seed_row("noisy_but_consistent", 89.0, 91.1, 87.1),  # 1.0, 0.9, 0.9 below a on every seed
            seed_row("a", 90.0, 92.0, 88.0),  # best: 90.00 ± 2.00
            seed_row("d", 99.9),  # one seed: never the best, ties nothing
            seed_row("steady_but_swapping", 90.0, 91.0, 87.5),  # 0.0, -1.0, -0.5: the sign is not settled
        ]
    )
    assert [(r["entry"], r["tie"]) for r in rows] == [
        ("d", False),
        ("a", False),
        ("steady_but_swapping", True),
        ("noisy_but_consistent", False),
    ]
    consistent = rows[3]["vs_best"]  # mean -0.933, sd 0.0577: half-width 4.303 * 0.0577 / sqrt(3) = 0.143
    assert (consistent.n, round(consistent.mean, 3), round(consistent.low, 3), round(consistent.high, 3)) == (
        3,
        -0.933,
        -1.077,
        -0.790,
    )
    # the old rule (gap <= std + std) called it a tie: 0.93 <= 2.0 + 2.0
    assert rows[3]["std"] + rows[1]["std"] > rows[1]["mean"] - rows[3]["mean"]
    assert verdict(rows).endswith(
        "Tied with it (the paired 95 % interval of the difference contains 0, so not a "
        "win either way): steady_but_swapping."
    )
    alone = mark_ties([seed_row("a", 90.0, 91.0), seed_row("b", 89.0, 89.5, 89.2)])  # one seed in common with... two
    assert alone[1]["vs_best"].n == 2
    apart = mark_ties([seed_row("a", 90.0, 91.0), {**seed_row("b", 85.0, 86.0), "runs": [{"seed": 7, "metric": 0.85}]}])
    assert apart[1]["vs_best"] is None and not apart[1]["tie"]  # no seed shared: no interval, no tie
    assert verdict([seed_row("x", 80.0)]).endswith("One seed only: no spread to compare with.")


def test_a_malformed_second_metric_is_refused(tmp_path):
    _, _ = tiny_plan(tmp_path, {"fedavg": {"overrides": ["method=fedavg"]}})
    path = tmp_path / "leaderboard.yaml"
    plan = yaml.safe_load(path.read_text())
    plan["protocols"]["tiny"]["second_metric"] = "final_global_acc"
    path.write_text(yaml.safe_dump(plan))
    with pytest.raises(ConfigError, match="second_metric must be"):
        load_plan(path)


def test_the_figure_panels_follow_the_families_and_meet_the_best_baselines():
    """One panel per family (best first, unnamed entries under 'other'); the first family's panel
    also draws the two best entries of the others; a small protocol is one panel; no two curves of
    a panel share colour and line style."""
    from pflower.reports.leaderboard import ONE_PANEL, line_styles, panel_layout

    plan = {
        "families": {"seed methods": ["fedcmd", "kapc"], "personal layers": ["fedper", "fedrep"], "global": ["fedavg"]}
    }
    entries = ["fedper", "fedcmd", "ditto", "fedrep", "kapc", "fedavg", "moon", "local", "feddyn"]  # best first
    rows = [{"entry": e} for e in entries]
    assert len(rows) > ONE_PANEL
    assert panel_layout(plan, rows) == [
        ("seed methods and the 2 best others", ["fedcmd", "kapc", "fedper", "ditto"]),
        ("personal layers", ["fedper", "fedrep"]),
        ("global", ["fedavg"]),
        ("other", ["ditto", "moon", "local", "feddyn"]),
    ]
    assert panel_layout(plan, rows[:3]) == [("every entry", ["fedper", "fedcmd", "ditto"])]
    styles = line_styles(23)
    assert len(set(styles)) == 23 and styles[10] == ("C0", "--")


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_a_protocol_runs_only_its_listed_entries_and_says_whether_a_verdict_changes(tmp_path):
    """`only` narrows a protocol to some entries of its group; `compare_to` puts the two tables side
    by side on the entries both finished, with best and ties re-marked among those entries alone."""
    from pflower.reports.leaderboard import compare_protocols

    plan, root = tiny_plan(tmp_path, {e: {"overrides": [f"method={e}", *TINY]} for e in ("fedavg", "local", "fedper")})
    plan["protocols"]["longer"] = {"experiment": "smoke", "entries": "all", "only": ["fedper", "fedavg"]}
    assert [(j.entry, j.seed) for j in plan_jobs(plan, root, ["longer"])] == [
        ("fedavg", 1),
        ("fedavg", 2),
        ("fedper", 1),
        ("fedper", 2),
    ]
    for bad, match in (
        ({"only": ["nosuch"]}, "only must list entries of its group 'all'; unknown: \\['nosuch'\\]"),
        ({"compare_to": "longer"}, "compare_to must name another protocol"),
        ({"compare_to": "nosuch"}, "compare_to must name another protocol"),
    ):
        path = tmp_path / "bad.yaml"
        path.write_text(
            yaml.safe_dump(
                {**plan, "protocols": {**plan["protocols"], "longer": {**plan["protocols"]["longer"], **bad}}}
            )
        )
        with pytest.raises(ConfigError, match=match):
            load_plan(path)

    # there (100 rounds): a best; b below a by 1.5, 1.3, 1.7 (behind); c within noise of a (tie);
    # x runs only there and does not count. Here (200 rounds): b best; a below b on every seed
    # (behind); c 2 seeds, -0.3 and -0.1 below b (a tie: t(0.975, 1) = 12.7 leaves 2 seeds a wide interval).
    there = mark_ties(
        [
            seed_row("a", 90.0, 91.0, 89.0),
            seed_row("b", 88.5, 89.7, 87.3),
            seed_row("c", 87.0, 92.0, 88.0),
            seed_row("x", 95.0, 95.1, 95.2),
        ]
    )
    here = mark_ties([seed_row("b", 91.0, 91.2, 90.8), seed_row("a", 90.0, 90.3, 89.7), seed_row("c", 90.7, 91.1)])
    text = compare_protocols(here, there, "fmnist_dir0.5")
    assert text.startswith(
        "Against `fmnist_dir0.5`, on the 3 entries both have finished on every planned seed (best and ties marked "
        "among these alone): "
        "the verdict changes for b (behind there, best here), a (best there, behind here)."
    ), text
    assert "| c | 2 / 2 | 90.90 ± 0.28 (2) | 89.00 ± 2.65 (3) | tie / tie |" in text
    assert "| b | 1 / 3 (up 2) |" in text and "| a | 3 / 1 (down 2) |" in text
    assert [line.split(" | ")[0] for line in text.splitlines()[4:]] == ["| b", "| c", "| a"]  # ranked here
    assert "no verdict changes" in compare_protocols(there[1:], there, "same")
    assert compare_protocols([seed_row("z", 1.0)], there, "p") == (
        "Against `p`: no entry has finished every planned seed on both yet."
    )
    # an entry still missing seeds on either side is left out of the comparison
    partial = [{**r, "planned": 3} for r in here]  # c has 2 of 3 seeds here
    assert "on the 2 entries" in compare_protocols(partial, there, "p") and "| c |" not in compare_protocols(
        partial, there, "p"
    )

    # on the page: the comparison under the protocol that names compare_to
    plan["protocols"]["longer"]["compare_to"] = "tiny"
    run_jobs(plan_jobs(plan, root, ["tiny"], ["fedavg", "fedper"]) + plan_jobs(plan, root, ["longer"]))
    text = write_page(plan, root, tmp_path / "docs" / "leaderboard.md").read_text()
    section = text.split("## longer")[1]
    assert (
        "Against `tiny`, on the 2 entries both have finished on every planned seed" in section
        and "## tiny" not in section
    )


def test_the_paired_difference_by_hand():
    """diffs 1, 2, 3: mean 2, sd 1, t(0.975, 2) = 4.3027, half-width 4.3027 / sqrt(3) = 2.4841."""
    from pflower.reports.paired import paired_difference

    got = paired_difference({1: 90.0, 2: 91.0, 3: 92.0, 9: 50.0}, {1: 89.0, 2: 89.0, 3: 89.0})
    assert got.n == 3 and got.mean == pytest.approx(2.0)
    assert (got.low, got.high) == (pytest.approx(2.0 - 2.48414, abs=1e-4), pytest.approx(2.0 + 2.48414, abs=1e-4))
    assert got.contains_zero and got.text() == "+2.00 [-0.48, +4.48] (3 seeds)"
    steady = paired_difference({1: 1.0, 2: 1.1, 3: 0.9}, {1: 0.0, 2: 0.0, 3: 0.0})  # half-width 0.2484
    assert not steady.contains_zero and steady.low == pytest.approx(0.75159, abs=1e-4)
    assert paired_difference({1: 1.0}, {1: 0.0, 2: 0.0}) is None  # one shared seed: no interval
