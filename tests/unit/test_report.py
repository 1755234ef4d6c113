"""`pflower report`: runs become a Markdown table with the paper's number beside ours."""

import json

import pytest

from server_app.report import find_runs, markdown, paper_numbers, report_rows


def fake_run(path, **summary):
    path.mkdir(parents=True)
    base = dict(method="fedcmd", dataset="fmnist", alpha=0.1, rounds=200, headline_test_before_acc=0.9665,
                last20_test_before_acc=0.96, final_acc=0.95, total_mib_down=100.0, total_mib_up=300.0,
                wall_time_s=600.0, personal_layer="fc2")
    (path / "summary.json").write_text(json.dumps({**base, **summary}))
    return path


def test_report_puts_paper_numbers_beside_ours(tmp_path):
    fake_run(tmp_path / "a" / "run1")
    fake_run(tmp_path / "a" / "run2", method="fedavg", personal_layer=None, headline_test_before_acc=0.5)
    rows = report_rows(find_runs([tmp_path]))
    by_method = {r["method"]: r for r in rows}
    assert by_method["fedcmd (l*=fc2)"]["paper"] == "96.57" and by_method["fedcmd (l*=fc2)"]["diff"] == "+0.08"
    assert by_method["fedavg"]["paper"] == "77.70" and by_method["fedavg"]["ours"] == "50.00"
    assert by_method["fedavg"]["MiB/round"] == "2.00"
    table = markdown(rows)
    assert table.count("\n") == 3 and table.startswith("| method |")


def test_paper_data_is_loaded_from_conf():
    assert paper_numbers()[("fedper", "fmnist", 0.5)][0] == pytest.approx(90.034)


def test_no_runs_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="summary.json"):
        find_runs([tmp_path])
