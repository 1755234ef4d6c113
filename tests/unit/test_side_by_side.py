"""benchmarks/authors/side_by_side.py: the paper's statistic from both codes' run files, and the
page block it rewrites."""

import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ is a folder of the checkout, not an installed package

from benchmarks.authors import side_by_side as sbs  # noqa: E402


def _authors(root: Path, variant: str, seed: int, curve: list[float]) -> None:
    d = root / "authors" / variant / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "fmnist_acc_metrics.csv").write_text("test_before,test_after\n" + "".join(f"{v},0\n" for v in curve))


def _pflower(root: Path, seed: int, method: dict, curve: list[float], finished: bool = True) -> None:
    d = root / "pflower" / f"seed{seed}" / "2026-11-26" / f"run-{len(list(root.rglob('metrics.jsonl')))}"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"method": method}))
    rows = [{"round": r + 1, "test_before_acc": v / 100} for r, v in enumerate(curve)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"final_acc": 0.5}\n')
    if finished:
        (d / "summary.json").write_text("{}")


def test_the_last_rounds_mean_per_code_method_and_seed(tmp_path):
    _authors(tmp_path, "fedcmd", 42, [10.0] * 5 + [90.0, 92.0])
    _authors(tmp_path, "fedcmd", 1, [0.0] * 5 + [94.0, 96.0])
    _pflower(tmp_path, 42, {"name": "fedcmd", "relay_phase2": False}, [50.0, 80.0, 88.0])
    _pflower(tmp_path, 42, {"name": "fedcmd", "relay_phase2": True}, [50.0, 90.0, 92.0])
    _pflower(tmp_path, 1, {"name": "fedcmd", "relay_phase2": True}, [10.0], finished=False)  # still running: left out
    runs = sbs.collect(tmp_path, ("relay_phase2",))
    assert set(runs) == {("authors", "fedcmd"), ("pflower", "fedcmd"), ("pflower", "fedcmd_relay_phase2")}
    text = sbs.table(tmp_path, {"fedcmd": 92.26}, 2, {}, ("relay_phase2",))
    row = next(line for line in text.splitlines() if line.startswith("| authors | fedcmd |"))
    assert "| 1, 42 | 95.00, 91.00 | 93.00 | 92.26 |" in row  # seeds sorted; last-2 means 95 and 91
    relay = next(line for line in text.splitlines() if "fedcmd_relay_phase2" in line)
    assert "| 42 | 91.00 | 91.00 | 92.26 |" in relay  # the method's paper number, whatever the variant
    assert (tmp_path / "curves.csv").read_text().count("\n") == 1 + 7 + 7 + 3 + 3
    rerun = sbs.table(tmp_path, {}, 2, {}, flags=" --paper fedcpmd --alpha 0.1")
    assert f"side_by_side {tmp_path} --paper fedcpmd --alpha 0.1` at" in rerun  # the command to rerun it, in full


def test_the_page_block_is_replaced_and_a_missing_block_is_named(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("a\n<!-- side-by-side:x -->\nold\n<!-- /side-by-side:x -->\nb\n")
    sbs.write_section(page, "x", "new table\n")
    assert page.read_text() == "a\n<!-- side-by-side:x -->\nnew table\n<!-- /side-by-side:x -->\nb\n"
    with pytest.raises(SystemExit, match="has no <!-- side-by-side:y -->"):
        sbs.write_section(page, "y", "t\n")


def test_the_paper_number_comes_from_either_results_layout():
    flat = {"results": {"fmnist": {0.5: {"fedcmd": 92.26}}}}
    tables = {"tables": [{"results": {"cifar10": {0.1: {"x": 1}}}}, {"results": {"fmnist": {0.1: {"fedcpmd": 9}}}}]}
    assert sbs.paper_numbers(flat, "fmnist", 0.5) == {"fedcmd": 92.26}
    assert sbs.paper_numbers(tables, "fmnist", 0.1) == {"fedcpmd": 9}
    with pytest.raises(SystemExit, match="no fmnist alpha=1.0"):
        sbs.paper_numbers(flat, "fmnist", 1.0)


def test_felo_code_evaluates_on_its_own_schedule():
    assert sbs.felo_eval_rounds("python main.py --op --epoch 10 --eval_every 5") == [1, 6, 11, 16, 20]
    assert sbs.felo_eval_rounds("python main.py --op --eval_every 20")[-3:] == [161, 181, 200]
    assert sbs.felo_eval_rounds("python main.py --op --epoch 100") == list(range(1, 200, 2))  # every 1/100


def test_the_final_metric_reads_the_felo_code_and_pflowers_final_evaluation(tmp_path):
    d = tmp_path / "authors" / "felo" / "seed1"
    d.mkdir(parents=True)
    (d / "command.txt").write_text("python main.py --op --KLD_flag --old_CNN --seed 1 --eval_every 20\n")
    (d / "evaluate_acc.txt").write_text("".join(f"{0.1 + 0.07 * i}\n" for i in range(11)))  # 10 % ... 80 %
    _pflower(tmp_path, 1, {"name": "felo"}, [60.0] * 190 + [70.0] * 10)
    (next(tmp_path.rglob("summary.json"))).write_text('{"final_acc": 0.8125}')
    text = sbs.final_table(tmp_path, {})
    authors = next(line for line in text.splitlines() if line.startswith("| authors | felo |"))
    assert "| 1 | 80.00 | 80.00 | 17.00 | 31.00 | 45.00 | 59.00 | 80.00 |" in authors  # evaluations 2, 4, 6, 8, 11
    pflower = next(line for line in text.splitlines() if line.startswith("| pflower | felo |"))
    assert "| 1 | 81.25 | 81.25 | 60.00 | 60.00 | 60.00 | 60.00 | 70.00 |" in pflower
    (d / "evaluate_acc.txt").write_text("0.5\n")
    with pytest.raises(SystemExit, match="1 evaluations, but its command.txt gives 11"):
        sbs.final_table(tmp_path, {})


def test_clusters_are_scored_alike_in_both_codes(tmp_path):
    """Each cluster's last-k mean, then weighted by clients and unweighted, by hand: fc1 (3 clients)
    ends 90, 92 -> 91; fc2 (1 client) ends 80, 84 -> 82; over clients (3*91 + 82)/4 = 88.75,
    over clusters (91 + 82)/2 = 86.5."""
    seed_dir = tmp_path / "authors" / "fedcpmd2" / "seed1"
    seed_dir.mkdir(parents=True)
    for name, curve in {"3_fc1": [50, 90, 92], "1_fc2": [50, 80, 84]}.items():
        (seed_dir / f"{name}_fmnist_acc_metrics.csv").write_text(
            "test_before,test_after\n" + "".join(f"{v},0\n" for v in curve)
        )
    (seed_dir / "fmnist_acc_metrics.csv").write_text("test_before\n1\n")  # a clustered run's: ignored
    ablation = tmp_path / "authors" / "fedsper_ablation" / "seed1"  # a run that forms no clusters: one group
    ablation.mkdir(parents=True)
    (ablation / "fmnist_acc_metrics.csv").write_text("test_before,test_after\n10,0\n70,0\n80,0\n")
    assert sbs.cluster_statistics(sbs.authors_clusters(ablation, "fmnist"), 2) == pytest.approx((75.0, 75.0))
    authors = sbs.authors_clusters(seed_dir, "fmnist")
    assert authors.sizes == {"fc1": 3, "fc2": 1}
    assert sbs.cluster_statistics(authors, 2) == pytest.approx((88.75, 86.5))

    run = tmp_path / "pflower_b" / "seed1" / "2026-11-28" / "run"
    run.mkdir(parents=True)
    rows = [{"round": 1, "test_before_acc": 0.5}]  # phase 1: no clusters yet
    rows += [
        {"round": r, "cluster_layers": ["fc1", "fc2"], "cluster_sizes": [3, 1], "cluster_acc": [a / 100, b / 100]}
        for r, a, b in [(2, 50, 50), (3, 90, 80), (4, 92, 84)]
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_text(yaml.safe_dump({"method": {"name": "fedcpmd", "distance": "bhattacharyya"}}))
    (run / "summary.json").write_text("{}")
    ours = sbs.pflower_clusters(run)
    assert ours.sizes == authors.sizes and sbs.cluster_statistics(ours, 2) == pytest.approx((88.75, 86.5))

    text = sbs.cluster_table(tmp_path, "fmnist", 97.803, 2, {}, "")
    assert "| authors | fedcpmd2 | 1 | fc1 3, fc2 1 | 88.75 | 88.75 | 86.50 | 86.50 | 97.803 |" in text
    assert "| pflower | fedcpmd (bhattacharyya) | 1 | fc1 3, fc2 1 | 88.75 | 88.75 | 86.50 | 86.50 | 97.803 |" in text
    assert "| authors | fedsper_ablation | 1 | no clustering | 75.00 | 75.00 | 75.00 | 75.00 | 97.803 |" in text
    with pytest.raises(SystemExit, match="no <clients>_<layer>_fmnist_acc_metrics.csv"):
        sbs.authors_clusters(tmp_path, "fmnist")
    (seed_dir / "9_fc1_fmnist_acc_metrics.csv").write_text("test_before,test_after\n1,1\n")  # another run's file
    with pytest.raises(SystemExit, match="two files for the cluster 'fc1'"):
        sbs.authors_clusters(seed_dir, "fmnist")


def test_every_table_on_the_authors_code_page_is_what_its_committed_runs_give(monkeypatch):
    """Each side-by-side block of docs/authors-code.md, re-rendered from the committed run files
    with the command its "Generated by" line names, equals the page (the commit in that line aside)."""
    import re
    import shlex

    monkeypatch.setattr(sbs, "_write_curves", lambda *a, **k: None)
    page = (ROOT / "docs" / "authors-code.md").read_text()
    blocks = re.findall(r"<!-- side-by-side:([\w.-]+) -->\n(.*?)<!-- /side-by-side:\1 -->", page, re.S)
    assert {name for name, _ in blocks} >= {"fedcmd", "fedcpmd", "fedcpmd-a0.5", "felo"}

    def without_commit(text: str) -> str:
        return re.sub(r"` at \w+\.$", "`", text, flags=re.M)

    for name, block in blocks:
        command = re.search(r"Generated by `python -m benchmarks\.authors\.side_by_side (.*?)` at", block).group(1)
        argv = shlex.split(command)
        argv[0] = str(ROOT / argv[0])
        text, _, _ = sbs.render(argv)
        assert without_commit(text) == without_commit(block), name
