"""`pflower report`: runs become a Markdown table with the paper's number beside ours."""

import json

import pytest

from pflower.reports.report import find_runs, markdown, paper_numbers, report_rows

PAPER_SETUP = "num_clients: 100\nfraction: 0.1\nmodel:\n  name: lenet5\npartition:\n  name: dirichlet\n"


def fake_run(path, config=PAPER_SETUP, **summary):
    """A run with FedCMD's paper set-up (N=100, 10% a round, 200 rounds, LeNet-5, Dirichlet) unless changed."""
    path.mkdir(parents=True)
    base = dict(
        method="fedcmd",
        dataset="fmnist",
        alpha=0.1,
        rounds=200,
        headline_test_before_acc=0.9665,
        last20_test_before_acc=0.96,
        final_acc=0.95,
        total_mib_down=100.0,
        total_mib_up=300.0,
        wall_time_s=600.0,
        personal_layer="fc2",
    )
    (path / "summary.json").write_text(json.dumps({**base, **summary}))
    (path / "config.yaml").write_text(config)
    return path


def test_report_puts_paper_numbers_beside_ours(tmp_path):
    fake_run(tmp_path / "a" / "run1")
    fake_run(tmp_path / "a" / "run2", method="fedavg", personal_layer=None, headline_test_before_acc=0.5)
    rows = report_rows(find_runs([tmp_path]))
    by_method = {r["method"]: r for r in rows}
    assert by_method["fedcmd (l*=fc2)"]["paper"] == "96.57" and by_method["fedcmd (l*=fc2)"]["diff"] == "+0.08"
    assert by_method["fedavg"]["paper"] == "77.70" and by_method["fedavg"]["ours"] == "50.00"
    assert by_method["fedavg"]["MiB/round"] == "2.00" and by_method["fedavg"]["model"] == "lenet5"
    assert by_method["fedavg"]["metric"] == "headline" and by_method["fedavg"]["paper set-up"] == ""
    table = markdown(rows)
    assert table.count("\n") == 3 and table.startswith("| method | model |")


def test_a_run_with_another_set_up_gets_no_paper_number_but_what_differs(tmp_path):
    fake_run(tmp_path / "short", rounds=3)
    fake_run(tmp_path / "resnet", config=PAPER_SETUP.replace("lenet5", "resnet18"))
    fake_run(tmp_path / "bare", config="")  # no set-up known: nothing to compare with
    rows = {r["model"] + str(r["rounds"]): r for r in report_rows(find_runs([tmp_path]))}
    assert rows["lenet53"]["paper"] == rows["lenet53"]["diff"] == "" and rows["lenet53"]["ours"] == "96.65"
    assert rows["lenet53"]["paper set-up"] == "differs: rounds 3 (paper 200)"
    assert rows["resnet18200"]["paper set-up"] == "differs: model resnet18 (paper lenet5)"
    assert rows["200"]["paper"] == "" and "model unknown (paper lenet5)" in rows["200"]["paper set-up"]


def test_options_pick_their_own_entry_and_a_paper_picks_its_metric(tmp_path):
    """FedCPMD's Table 13 has one number per distance and compares the cluster mean; KAPC's tables
    compare the best round and need KAPC's Scenario A set-up."""
    for distance, cluster in (("js", 0.95), ("w2", 0.96)):
        run = fake_run(tmp_path / distance, method="fedcpmd", personal_layer=None, mean_cluster_acc=cluster)
        if distance != "js":
            (run / "config.yaml").write_text(PAPER_SETUP + f"method:\n  name: fedcpmd\n  distance: {distance}\n")
    kapc_a = (
        "num_clients: 10\nfraction: 1.0\nmodel:\n  name: cnn_kapc\npartition:\n  name: dirichlet\n"
        "dataset:\n  subsample: 0.1\n"
    )
    fake_run(tmp_path / "kapc", config=kapc_a, method="kapc", rounds=50, personal_layer=None, best_mean_acc=0.97)
    fake_run(
        tmp_path / "local", config=kapc_a, method="local", rounds=50, personal_layer=None, best_test_before_acc=0.9
    )
    fake_run(
        tmp_path / "fedavg",
        config=kapc_a,
        method="fedavg",
        rounds=50,
        personal_layer=None,
        best_mean_acc=0.6,
        best_test_before_acc=0.5,
    )
    rows = {r["method"]: r for r in report_rows(find_runs([tmp_path]))}
    assert (rows["fedcpmd"]["paper"], rows["fedcpmd"]["ours"], rows["fedcpmd"]["metric"]) == (
        "93.50",
        "95.00",
        "cluster mean",
    )
    assert (rows["fedcpmd (distance=w2)"]["paper"], rows["fedcpmd (distance=w2)"]["ours"]) == ("95.28", "96.00")
    assert (rows["kapc"]["paper"], rows["kapc"]["ours"], rows["kapc"]["metric"]) == (
        "96.71",
        "97.00",
        "best round, trained",
    )
    # one metric for every method; a run made before every method recorded it says what it shows instead
    assert (rows["fedavg"]["paper"], rows["fedavg"]["ours"], rows["fedavg"]["metric"]) == (
        "57.85",
        "60.00",
        "best round, trained",
    )
    assert (rows["local"]["paper"], rows["local"]["ours"]) == ("88.33", "90.00")
    assert rows["local"]["metric"] == "best round (test_before: the run predates best_mean_acc)"


def test_a_control_run_is_labelled_with_the_options_it_changed(tmp_path):
    """config.yaml's method options that differ from conf/method/<name>.yaml name the row;
    interpolated defaults (total_rounds: ${rounds}) never count as changed."""
    control = fake_run(tmp_path / "ctl", method="fedbabu", personal_layer=None)
    (control / "config.yaml").write_text(
        PAPER_SETUP + "method:\n  name: fedbabu\n  finetune_epochs: 0\n  finetune_part: all\n"
    )
    plain = fake_run(tmp_path / "plain", method="fedcmd", alpha=0.5)
    (plain / "config.yaml").write_text(
        PAPER_SETUP + "method:\n  name: fedcmd\n  kp: 20\n  total_rounds: 200\n  force_layer: fc2\n"
    )
    labels = {r["method"]: r for r in report_rows(find_runs([tmp_path]))}
    assert set(labels) == {"fedbabu (finetune_epochs=0)", "fedcmd (force_layer=fc2, l*=fc2)"}
    assert labels["fedbabu (finetune_epochs=0)"]["paper"] == "74.81"  # still the method's paper number


def test_rows_that_would_read_the_same_say_what_tells_them_apart(tmp_path):
    """Issue 76 (6): two fedcmd rows with nothing telling them apart now show the setting that
    differs (seed=...), or the run directory's name where no setting does; a row alone is unchanged."""
    seeded = PAPER_SETUP + "seed: {}\noutput_dir: {}\n"
    fake_run(tmp_path / "a" / "10-00-00-fedcmd-fmnist", config=seeded.format(1, "x"))
    fake_run(tmp_path / "a" / "10-05-00-fedcmd-fmnist", config=seeded.format(2, "y"))
    labels = [r["method"] for r in report_rows(find_runs([tmp_path / "a"]))]
    assert labels == ["fedcmd (l*=fc2) [seed=1]", "fedcmd (l*=fc2) [seed=2]"]  # output_dir is not a setting
    fake_run(tmp_path / "b" / "10-00-00-fedcmd-fmnist")
    fake_run(tmp_path / "b" / "11-00-00-fedcmd-fmnist")
    fake_run(tmp_path / "b" / "12-00-00-fedavg-fmnist", method="fedavg", personal_layer=None)
    labels = [r["method"] for r in report_rows(find_runs([tmp_path / "b"]))]
    assert labels == ["fedcmd (l*=fc2) [10-00-00-fedcmd-fmnist]", "fedcmd (l*=fc2) [11-00-00-fedcmd-fmnist]", "fedavg"]


def test_paper_data_is_loaded_from_conf():
    assert paper_numbers()[("fedper", "fmnist", 0.5)][0] == pytest.approx(90.034)
    assert paper_numbers()[("kapc_bls", "fmnist", 0.1)][0] == pytest.approx(96.57)  # Table 1 (Scenario A) comes first


def test_no_runs_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="summary.json"):
        find_runs([tmp_path])


# ---------------------------------------------------------------------------- figures and report.md

import struct  # noqa: E402

from pflower.reports.report import (  # noqa: E402
    ReportError,
    curve_points,
    group_runs,
    legend_labels,
    load_curve,
    load_summary,
    main,
    rolling_mean,
    write_report,
)
from pflower.server_app.results import RunWriter  # noqa: E402
from pflower.strategies.base.evaluation import summarize  # noqa: E402

MIB = 2**20


def real_run(path, method="fedavg", dataset="fmnist", alpha=0.1, rounds=6, acc=None, partition="dirichlet", **extra):
    """A run directory in the runner's format: metrics.jsonl written by RunWriter, summary.json
    from strategies.evaluation.summarize plus the runner's keys."""
    path.mkdir(parents=True)
    writer = RunWriter(path)
    acc = acc or [0.1 * (i + 1) for i in range(rounds)]
    for r in range(1, rounds + 1):
        writer.append_round(
            {
                "round": r,
                "clients": [0, 1],
                "dropped": [],
                "bytes_down": MIB,
                "bytes_up": MIB // 2,
                "test_before_acc": acc[r - 1],
                "test_before_loss": 1.0,
                "test_after_acc": acc[r - 1],
                "test_after_loss": 1.0,
                "train_loss": 0.5,
                "round_time_s": 0.25,
            }
        )
    summary = {
        "method": method,
        "dataset": dataset,
        "model": "lenet5",
        "partition": partition,
        "alpha": alpha,
        "num_clients": 2,
        **summarize(writer.rounds),
        "final_acc": 0.5,
        "final_clients": 2.0,
        "wall_time_s": 3.0,
        "run_dir": str(path),
        **extra,
    }
    writer.write_summary(summary)
    return path


def two_groups(root):
    real_run(root / "sweep" / "10-00-00-fedcmd-fmnist", method="fedcmd", personal_layer="fc2")
    real_run(root / "sweep" / "10-05-00-fedavg-fmnist", acc=[0.2, 0.3, 0.4, None, 0.5, 0.6])
    real_run(root / "other" / "11-00-00-fedavg-digits", dataset="digits", alpha=None, partition="iid", rounds=3)
    return find_runs([root])


def png_chunks(data: bytes) -> list[bytes]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, i = [], 8
    while i < len(data):
        (n,) = struct.unpack(">I", data[i : i + 4])
        chunks.append(data[i + 4 : i + 8])
        i += 12 + n
    return chunks


def test_curve_is_read_from_metrics_jsonl(tmp_path):
    run = real_run(tmp_path / "run", acc=[0.5, 0.25, None, 1.0], rounds=4)
    curve = load_curve(run)
    assert curve.rounds == (1, 2, 3, 4)
    assert curve.acc == (50.0, 25.0, None, 100.0)
    assert curve.mib == (1.5, 3.0, 4.5, 6.0)  # cumulative down + up
    assert curve_points(curve, "round") == (
        [1.0, 2.0, 4.0],
        [50.0, 25.0, 100.0],
    )  # the round without accuracy is left out
    assert curve_points(curve, "mib") == ([1.5, 3.0, 6.0], [50.0, 25.0, 100.0])
    assert curve_points(curve, "round", smooth=2)[1] == [50.0, 37.5, 62.5]


def test_rolling_mean_is_trailing_and_window_one_is_raw():
    assert rolling_mean([1.0, 2.0, 3.0, 4.0], 1) == [1.0, 2.0, 3.0, 4.0]
    assert rolling_mean([1.0, 2.0, 3.0, 4.0], 3) == [1.0, 1.5, 2.0, 3.0]
    with pytest.raises(ValueError):
        rolling_mean([1.0], 0)


def test_runs_are_grouped_by_dataset_and_alpha(tmp_path):
    groups = group_runs(two_groups(tmp_path))
    assert [(g.dataset, g.alpha, g.stem, g.title) for g in groups] == [
        ("digits", None, "digits_iid", "digits, iid partition"),
        ("fmnist", 0.1, "fmnist_a0.1", "fmnist, α = 0.1"),
    ]
    assert legend_labels(groups[1]) == ["fedcmd (l*=fc2)", "fedavg"]


def test_runs_that_read_different_data_never_share_a_table(tmp_path):
    """Two fmnist runs whose recorded fingerprints differ (another dataset.root) get a group each, named
    by the fingerprint; a run from before fingerprints were recorded joins the one recorded group."""
    real_run(tmp_path / "10-00-00-fedavg-fmnist", data_sha256="a" * 64, data_dir="/data/one")
    real_run(tmp_path / "10-01-00-fedper-fmnist", method="fedper", data_sha256="b" * 64, data_dir="/data/two")
    groups = group_runs(find_runs([tmp_path]))
    assert [(g.title, g.stem, len(g.runs)) for g in groups] == [
        ("fmnist, α = 0.1, data aaaaaaaa", "fmnist_a0.1_data-aaaaaaaa", 1),
        ("fmnist, α = 0.1, data bbbbbbbb", "fmnist_a0.1_data-bbbbbbbb", 1),
    ]
    text = (write_report(find_runs([tmp_path]), tmp_path / "out")[0]).read_text()
    assert "Data: `/data/one` (sha256 `aaaaaaaaaaaaaaaa`)." in text
    old = tmp_path / "only"
    real_run(old / "10-00-00-fedavg-fmnist", data_sha256="a" * 64)
    real_run(old / "09-00-00-local-fmnist", method="local")  # no fingerprint: an older run
    (group,) = group_runs(find_runs([old]))
    assert len(group.runs) == 2 and group.title == "fmnist, α = 0.1"


def test_a_group_without_paper_numbers_says_so_instead_of_blank_columns(tmp_path):
    real_run(tmp_path / "10-00-00-fedavg-fmnist", dataset="synthetic")
    table = markdown(report_rows(find_runs([tmp_path])))
    assert "| paper |" not in table and "paper set-up" not in table.splitlines()[0]
    assert "No paper's table in conf/paper_results/ has numbers" in table


def test_same_method_twice_in_a_group_gets_the_run_name(tmp_path):
    real_run(tmp_path / "10-00-00-fedavg-fmnist")
    real_run(tmp_path / "10-01-00-fedavg-fmnist")
    (group,) = group_runs(find_runs([tmp_path]))
    assert legend_labels(group) == ["fedavg [10-00-00-fedavg-fmnist]", "fedavg [10-01-00-fedavg-fmnist]"]


def test_report_writes_markdown_and_two_figures_per_group(tmp_path):
    runs = two_groups(tmp_path / "runs")
    out = tmp_path / "report"
    written = write_report(runs, out)
    names = sorted(p.name for p in written)
    assert names == sorted(
        [
            "report.md",
            "digits_iid_accuracy_vs_round.png",
            "digits_iid_accuracy_vs_mib.png",
            "fmnist_a0.1_accuracy_vs_round.png",
            "fmnist_a0.1_accuracy_vs_mib.png",
        ]
    )
    assert sorted(p.name for p in out.iterdir()) == names
    md = (out / "report.md").read_text()
    assert md.endswith("`\n") and not md.endswith("\n\n")  # one final newline (issue 76, 6)
    assert md.index("## digits, iid partition") < md.index("## fmnist, α = 0.1")
    assert "![fmnist, α = 0.1: accuracy vs round](fmnist_a0.1_accuracy_vs_round.png)" in md
    assert "![fmnist, α = 0.1: accuracy vs MiB](fmnist_a0.1_accuracy_vs_mib.png)" in md
    assert "| fedcmd (l*=fc2) | lenet5 | fmnist | 0.1 | 6 |" in md and "96.57" not in md  # 6 rounds: no paper number
    assert "differs: num_clients 2 (paper 100)" in md
    assert "- fedavg: `../runs/sweep/10-05-00-fedavg-fmnist`" in md  # relative to the report: no absolute paths
    assert str(tmp_path) not in md
    for png in out.glob("*.png"):
        assert png.stat().st_size > 5000


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_report_is_byte_identical_across_runs(tmp_path):
    runs = two_groups(tmp_path / "runs")
    a, b = tmp_path / "a", tmp_path / "b"
    write_report(runs, a)
    write_report(list(reversed(runs)), b)  # the order runs are given in does not matter either
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir())
    for name in files:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    for png in a.glob("*.png"):  # no date, no software version
        chunks = png_chunks(png.read_bytes())
        assert not {b"tEXt", b"iTXt", b"zTXt", b"tIME"} & set(chunks), chunks


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_smoothing_is_said_in_the_report(tmp_path):
    runs = two_groups(tmp_path / "runs")
    write_report(runs, tmp_path / "raw")
    write_report(runs, tmp_path / "smooth", smooth=3)
    assert "accuracy per round" in (tmp_path / "raw" / "report.md").read_text()
    assert "rolling mean over 3 rounds" in (tmp_path / "smooth" / "report.md").read_text()
    raw, smooth = (tmp_path / d / "fmnist_a0.1_accuracy_vs_round.png" for d in ("raw", "smooth"))
    assert raw.read_bytes() != smooth.read_bytes()


def test_cli_without_out_prints_the_table_only(tmp_path, capsys):
    two_groups(tmp_path / "runs")
    before = sorted(tmp_path.rglob("*"))
    assert main([str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| method |") and out.count("\n") == 5  # header, rule, 3 runs
    assert sorted(tmp_path.rglob("*")) == before


def test_cli_with_out_writes_the_report(tmp_path, capsys):
    two_groups(tmp_path / "runs")
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "rep"), "--smooth", "2"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("| method |")
    assert f"wrote {tmp_path / 'rep' / 'report.md'}" in captured.err
    assert (tmp_path / "rep" / "fmnist_a0.1_accuracy_vs_mib.png").exists()


def corrupt(tmp_path, name, text):
    run = real_run(tmp_path / "runs" / "r1")
    (run / name).write_text(text)
    return run


@pytest.mark.parametrize(
    "name, text, match",
    [
        ("summary.json", '{"method": "fedavg", ', r"summary\.json: not valid JSON \(.* at line 1 column"),
        ("summary.json", "[1, 2]", r"summary\.json: holds a JSON list, not an object"),
        ("summary.json", '{"method": "fedavg"}', r"summary\.json: missing key\(s\) \['dataset', 'rounds'"),
        (
            "summary.json",
            json.dumps(
                {
                    **dict(
                        method="a",
                        dataset="b",
                        rounds="ten",
                        headline_test_before_acc=0.5,
                        last20_test_before_acc=0.5,
                        total_mib_down=1,
                        total_mib_up=1,
                        wall_time_s=1,
                    )
                }
            ),
            r"summary\.json: rounds is 'ten', not int",
        ),
    ],
)
def test_corrupt_summary_is_named(tmp_path, name, text, match):
    run = corrupt(tmp_path, name, text)
    with pytest.raises(ReportError, match=match) as info:
        load_summary(run)
    assert str(run / "summary.json") in str(info.value)


@pytest.mark.parametrize(
    "text, match",
    [
        ('{"round": 1, "test_before_acc": 0.5}\n{"round": 2, "test_bef', r"metrics\.jsonl line 2: not valid JSON"),
        ('{"round": 1}\n\n"x"\n', r"metrics\.jsonl line 3: holds a JSON str, not an object"),
        ('{"round": "1"}\n', r"metrics\.jsonl line 1: 'round' is '1', not an integer"),
        ('{"round": 2}\n{"round": 1}\n', r"metrics\.jsonl line 2: round 1 after round 2 \(rounds must increase\)"),
        ('{"round": 1, "test_before_acc": "high"}\n', r"line 1: 'test_before_acc' is 'high', not a number"),
        ('{"round": 1, "bytes_up": -5}\n', r"line 1: 'bytes_up' is -5, not a byte count"),
        ("\n", r"metrics\.jsonl: holds no rounds"),
    ],
)
def test_corrupt_metrics_is_named(tmp_path, text, match):
    run = corrupt(tmp_path, "metrics.jsonl", text)
    with pytest.raises(ReportError, match=match) as info:
        load_curve(run)
    assert str(run / "metrics.jsonl") in str(info.value)


def test_bad_input_stops_the_cli_before_writing(tmp_path, capsys):
    run = corrupt(tmp_path, "metrics.jsonl", '{"round": 1}\n{oops\n')
    real_run(tmp_path / "runs" / "r2")
    assert main([str(tmp_path / "runs")]) == 0  # the table needs only summary.json
    capsys.readouterr()
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"pflower report: {run / 'metrics.jsonl'} line 2: not valid JSON" in captured.err
    assert not (tmp_path / "rep").exists()
    (run / "metrics.jsonl").unlink()
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 2
    assert f"{run / 'metrics.jsonl'}: missing" in capsys.readouterr().err


def test_cli_usage_errors(tmp_path, capsys):
    assert main([]) == 2
    assert main([str(tmp_path), "--smooth", "0"]) == 2
    assert "--smooth must be >= 1" in capsys.readouterr().err
    assert main([str(tmp_path / "nothing")]) == 2
    assert "no run directory" in capsys.readouterr().err


def test_an_iid_or_shards_run_finds_its_table_by_partition_name(tmp_path):
    """FedTSDP's Tables 3 and 5 have no alpha: their results are keyed by the partition's name."""
    setup = "num_clients: 20\nfraction: 1.0\nmodel:\n  name: cnn_fedtsdp\npartition:\n  name: {}\n"
    fake_run(
        tmp_path / "iid",
        config=setup.format("iid"),
        method="fedtsdp",
        dataset="cifar10",
        alpha=None,
        partition="iid",
        final_acc=0.7,
        personal_layer=None,
    )
    fake_run(
        tmp_path / "shards",
        config=setup.format("shards"),
        method="fedper",
        dataset="cifar10",
        alpha=None,
        partition="shards",
        final_acc=0.9,
        personal_layer=None,
    )
    rows = {r["method"]: r for r in report_rows(find_runs([tmp_path]))}
    assert rows["fedtsdp"]["paper"] == "72.98" and rows["fedtsdp"]["metric"] == "final_acc"
    assert rows["fedper"]["paper"] == "90.22" and rows["fedper"]["diff"] == "-0.22"
    assert paper_numbers()[("fedtsdp", "cifar10", 0.5)][0] == 79.29


def test_a_fedtsdp_run_gets_its_mechanism_figure_with_the_hopkins_trajectory(tmp_path):
    """H per round, the re-clustering rounds and the threshold from the run's config.yaml; runs
    without H (the baselines of the group) add nothing to that figure."""
    run = real_run(tmp_path / "runs" / "10-00-00-fedtsdp-fmnist", method="fedtsdp", rounds=4)
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for rec, h, fired in zip(lines, [0.9, 0.5, 0.7, 0.6], [1, 0, 1, 0]):
        rec.update(hopkins=h, triggered=fired)
    (run / "metrics.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    (run / "config.yaml").write_text("method:\n  name: fedtsdp\n  h_th: 0.65\n")
    real_run(tmp_path / "runs" / "10-05-00-fedavg-fmnist")
    curve = load_curve(run)
    assert curve.diagnostics["hopkins"] == (0.9, 0.5, 0.7, 0.6)
    assert tuple(r for r, t in zip(curve.rounds, curve.diagnostics["triggered"]) if t) == (1, 3)
    assert "hopkins" not in load_curve(tmp_path / "runs" / "10-05-00-fedavg-fmnist").diagnostics
    out = tmp_path / "report"
    names = {p.name for p in write_report(find_runs([tmp_path / "runs"]), out)}
    png = "fmnist_a0.1_fedtsdp_mechanism.png"
    assert png in names and (out / png).stat().st_size > 5000 and not any("fedavg_mechanism" in n for n in names)
    assert f"![fmnist, α = 0.1: fedtsdp's mechanism per round]({png})" in (out / "report.md").read_text()
    lines[1]["hopkins"] = "high"
    (run / "metrics.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    with pytest.raises(ReportError, match=r"line 2: 'hopkins' is 'high', not a number"):
        load_curve(run)


def test_runs_of_one_group_that_differ_in_seed_are_named_by_it(tmp_path):
    """Three seeds of one set-up are three rows: each names its seed (from config.yaml) in the
    table and the legend; the runs list names every run's seed and commit; a group of one seed
    keeps its plain labels."""
    for name, seed in (("10-00-00-fedper-fmnist", 42), ("10-01-00-fedper-fmnist", 43), ("10-02-00-fedavg-fmnist", 44)):
        run = real_run(tmp_path / "runs" / name, method=name.split("-")[3])
        (run / "config.yaml").write_text(f"seed: {seed}\nmethod:\n  name: {name.split('-')[3]}\n")
    (group,) = group_runs(find_runs([tmp_path / "runs"]))
    assert legend_labels(group) == ["fedper, seed 42", "fedper, seed 43", "fedavg, seed 44"]
    write_report(find_runs([tmp_path / "runs"]), tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| fed")] == [
        "fedper, seed 42",
        "fedper, seed 43",
        "fedavg, seed 44",
    ]
    assert "- fedper, seed 43 (seed 43): `" in text
    (tmp_path / "runs" / "10-01-00-fedper-fmnist" / "config.yaml").write_text("seed: 42\nmethod:\n  name: fedper\n")
    (tmp_path / "runs" / "10-02-00-fedavg-fmnist" / "config.yaml").write_text("seed: 42\nmethod:\n  name: fedavg\n")
    (group,) = group_runs(find_runs([tmp_path / "runs"]))
    assert legend_labels(group) == ["fedper [10-00-00-fedper-fmnist]", "fedper [10-01-00-fedper-fmnist]", "fedavg"]


def test_runs_of_one_group_that_differ_in_their_training_set_up_are_named_by_it(tmp_path):
    """A batch-256 Local beside a batch-64 Local of the same seed: the rows and the legend say the
    batch size (and only what differs), instead of two rows that read as one set-up."""
    for name, batch in (("10-00-00-local-fmnist", 64), ("10-01-00-local-fmnist", 256)):
        run = real_run(tmp_path / "runs" / name, method="local")
        (run / "config.yaml").write_text(f"seed: 42\nbatch_size: {batch}\nlr: 0.01\nmethod:\n  name: local\n")
    (group,) = group_runs(find_runs([tmp_path / "runs"]))
    assert legend_labels(group) == ["local, batch_size 64", "local, batch_size 256"]
    write_report(find_runs([tmp_path / "runs"]), tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| local")] == [
        "local, batch_size 64",
        "local, batch_size 256",
    ]


def test_a_threshold_the_run_logged_is_drawn_instead_of_the_option(tmp_path, monkeypatch):
    """FedTSDP with eps2_mode=median compares weight distances with eps2 x their median, not with
    eps2: the figure draws the logged radius (eps2_radius) in its re-clustering rounds, and the
    option's line only for runs that logged none."""
    from matplotlib.axes import Axes

    run = real_run(tmp_path / "runs" / "10-00-00-fedtsdp-fmnist", method="fedtsdp", rounds=3)
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for rec, extra in zip(
        lines, [{"weight_dist_median": 1.0, "eps2_radius": 0.7}, {}, {"weight_dist_median": 0.2, "eps2_radius": 0.14}]
    ):
        rec.update(hopkins=0.7, triggered=int(bool(extra)), **extra)
    (run / "metrics.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    (run / "config.yaml").write_text("method:\n  name: fedtsdp\n  h_th: 0.65\n  eps2: 0.7\n  eps2_mode: median\n")
    assert load_curve(run).diagnostics["eps2_radius"] == (0.7, None, 0.14)
    dashed, flat = [], []
    plot, axhline = Axes.plot, Axes.axhline
    monkeypatch.setattr(
        Axes,
        "plot",
        lambda ax, *a, **k: (
            (dashed.append((list(a[0]), list(a[1]))) if k.get("linestyle") == "--" else None) or plot(ax, *a, **k)
        ),
    )
    monkeypatch.setattr(Axes, "axhline", lambda ax, y=0, *a, **k: flat.append(y) or axhline(ax, y, *a, **k))
    write_report(find_runs([tmp_path / "runs"]), tmp_path / "report")
    assert dashed == [([1, 3], [0.7, 0.14])]  # the radius used, in the rounds it was used
    assert flat == [0.65]  # h_th still from the option; eps2's 0.7 is not drawn as a distance


def test_kapc_and_cfl_runs_get_their_mechanism_panels_per_layer_and_per_split(tmp_path):
    """A list value (per layer) is read as one line per entry; CFL's split rounds are its events;
    a value that is neither a number nor a list of numbers is named."""
    kapc = real_run(tmp_path / "runs" / "10-00-00-kapc_bls-fmnist", method="kapc_bls", rounds=3)
    cfl = real_run(tmp_path / "runs" / "10-01-00-cfl-fmnist", method="cfl", rounds=3)
    for run, extra in (
        (
            kapc,
            [
                {"cube_delta": 0.1, "self_weight_by_layer": [0.1, 0.2], "masked_by_layer": [0, 1]},
                {"cube_delta": 0.05, "self_weight_by_layer": [0.3, 0.8], "masked_by_layer": [0, 4]},
                {"cube_delta": 0.01, "self_weight_by_layer": [0.4, 0.9], "masked_by_layer": [1, 5]},
            ],
        ),
        (
            cfl,
            [
                {"max_update_norm": 0.5, "splits": 0, "num_clusters": 1},
                {"max_update_norm": 0.6, "splits": 1, "num_clusters": 2},
                {"max_update_norm": 0.3, "splits": 0, "num_clusters": 2},
            ],
        ),
    ):
        lines = [json.loads(line) | e for line, e in zip((run / "metrics.jsonl").read_text().splitlines(), extra)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    (cfl / "config.yaml").write_text("method:\n  name: cfl\n  eps2: 0.4\n")
    assert load_curve(kapc).diagnostics["self_weight_by_layer"] == ((0.1, 0.2), (0.3, 0.8), (0.4, 0.9))
    assert load_curve(cfl).diagnostics["splits"] == (0.0, 1.0, 0.0)
    out = tmp_path / "report"
    names = {p.name for p in write_report(find_runs([tmp_path / "runs"]), out)}
    assert {"fmnist_a0.1_kapc_bls_mechanism.png", "fmnist_a0.1_cfl_mechanism.png"} <= names
    lines[0]["max_update_norm"] = [0.5, "x"]
    (cfl / "metrics.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    with pytest.raises(ReportError, match=r"line 1: 'max_update_norm' is \[0.5, 'x'\], not a number"):
        load_curve(cfl)


FELO_SETUP = (
    "num_clients: 20\nfraction: 0.2\npartition:\n  name: dirichlet\nmodel:\n  name: mixed\n  assign: blocks\n  archs:\n"
    + "".join(f"    resnet{d}: {{name: resnet{d}}}\n" for d in (10, 14, 18, 22, 26))
)


def test_felo_runs_compare_the_global_test_set_and_name_their_architecture_set(tmp_path):
    """A mixed federation is named by the conf/model file with its architectures; Felo's paper
    metric (the second half's mean global-test accuracy) comes from metrics.jsonl when summary.json
    lacks it; FedHe's from its clients' final evaluation; the global columns appear only then."""
    felo = fake_run(
        tmp_path / "felo",
        config=FELO_SETUP + "method:\n  name: felo\n",
        method="felo",
        dataset="cifar10",
        alpha=0.5,
        rounds=400,
        personal_layer=None,
    )
    lines = [
        {"round": r, "test_before_acc": 0.5} | ({"global_acc": r / 1000} if r % 100 == 0 else {}) for r in range(1, 401)
    ]
    (felo / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    extreme = FELO_SETUP.replace("resnet14: {name: resnet14}", "resnet34: {name: resnet34}").replace(
        "resnet22: {name: resnet22}", "resnet50: {name: resnet50, feature_dim: 512}"
    )
    extreme = extreme.replace("    resnet26: {name: resnet26}\n", "").replace(
        "    resnet50:", "    resnet26: {name: resnet26}\n    resnet50:"
    )
    fake_run(
        tmp_path / "fedhe",
        config=extreme,
        method="fedhe",
        dataset="cifar10",
        alpha=0.5,
        rounds=400,
        personal_layer=None,
        final_global_acc=0.40,
    )
    rows = {r["method"]: r for r in report_rows(find_runs([tmp_path]))}
    assert rows["felo"]["model"] == "resnets_previous" and rows["fedhe"]["model"] == "resnets_extreme"
    # evaluations at rounds 100..400: the second half is rounds 300 and 400
    assert (rows["felo"]["ours"], rows["felo"]["paper"], rows["felo"]["metric"]) == (
        "35.00",
        "56.88",
        "global test, 2nd half",
    )
    assert rows["felo"]["global test final"] == "40.00" and rows["felo"]["global test 2nd half"] == "35.00"
    assert (rows["fedhe"]["ours"], rows["fedhe"]["paper"], rows["fedhe"]["metric"]) == (
        "40.00",
        "38.97",
        "global test, final",
    )
    table = markdown(list(rows.values()))
    assert "| final (all clients) | global test final | global test 2nd half | MiB/round |" in table
    assert "| final (all clients) | MiB/round |" in markdown(
        [{**rows["felo"], "global test final": "", "global test 2nd half": ""}]
    )
    from pflower.reports.report import group_runs, legend_labels

    (group,) = group_runs(find_runs([tmp_path]))
    assert legend_labels(group) == ["fedhe, resnets_extreme", "felo, resnets_previous"]


def test_the_mechanism_panels_come_from_the_strategies_and_name_real_options():
    """Each method declares its own diagnostics (``diagnostic_panels``); a threshold a panel draws
    is one of that method's options."""
    from pflower.reports.report import mechanism_keys, mechanisms
    from pflower.strategies import method_options

    panels = mechanisms()
    assert set(panels) == {"kapc", "kapc_bls", "fedtsdp", "cfl", "velo"}
    assert [p.key for p in panels["kapc_bls"][:2]] == [p.key for p in panels["kapc"]]  # BLS adds to KAPC's
    for method, declared in panels.items():
        for panel in declared:
            assert panel.threshold is None or panel.threshold in method_options(method), (method, panel.threshold)
    assert {"hopkins", "triggered", "splits", "cube_delta"} <= mechanism_keys()
