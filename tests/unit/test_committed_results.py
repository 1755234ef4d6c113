"""The committed results regenerate: `pflower report` on the runs a committed report.md lists
gives the same tables and the same figure files (docs/results/)."""

import re
from pathlib import Path

import pytest

from pflower.reports.report import write_report

ROOT = Path(__file__).resolve().parents[2]
REPORTS = sorted((ROOT / "docs" / "results").rglob("report.md"))


def test_there_are_committed_reports():
    assert REPORTS, "docs/results/ has no report.md: regenerate them with `pflower report <runs> --out <dir>`"


@pytest.mark.parametrize("report", REPORTS, ids=lambda p: str(p.parent.relative_to(ROOT)))
@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_committed_report_regenerates(report: Path, tmp_path: Path):
    text = report.read_text()
    runs = [(report.parent / rel).resolve() for rel in re.findall(r"^- .*: `([^`]+)`$", text, flags=re.M)]
    assert runs and all((r / "summary.json").exists() for r in runs), "a run listed in the report is missing"
    written = write_report(runs, tmp_path)
    fresh = (tmp_path / "report.md").read_text()

    def tables(s: str) -> list[str]:
        return [line for line in s.splitlines() if line.startswith("|") or line.startswith("![")]

    assert tables(fresh) == tables(text)
    for png in written[1:]:
        assert (report.parent / png.name).exists(), f"{png.name} is not committed beside {report}"
