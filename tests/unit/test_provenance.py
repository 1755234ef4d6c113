"""provenance.json: every run records the commit, command, date and versions it came from."""

import json
import subprocess
from pathlib import Path

import pytest

from pflower.reports.report import write_report
from pflower.server_app import provenance as prov
from pflower.server_app.runner import run_experiment
from pflower.simulation.inprocess import InProcessGrid


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True, capture_output=True
    )


def test_git_state_names_the_commit_and_only_code_changes_make_it_dirty(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "strategies").mkdir()
    (tmp_path / "strategies" / "a.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("docs\n")
    git(tmp_path, "add", "strategies/a.py", "README.md")
    git(tmp_path, "commit", "-qm", "one")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "results.json").write_text("{}")  # an untracked result does not make the code dirty
    (tmp_path / "README.md").write_text("edited docs\n")  # nor does an edited README
    assert prov.git_state(tmp_path) == {"git_commit": head, "git_dirty": False}
    (tmp_path / "strategies" / "a.py").write_text("x = 2\n")
    assert prov.git_state(tmp_path) == {"git_commit": head, "git_dirty": True}


def test_no_checkout_records_none(tmp_path):
    assert prov.git_state(tmp_path) == {"git_commit": None, "git_dirty": None}


def test_a_fab_built_from_a_checkout_records_that_checkouts_commit(tmp_path, monkeypatch):
    """Under `flwr run` the code runs from the unpacked FAB (no .git): the commit is that of the
    checkout whose working tree holds the same code (issue 58), pyproject.toml aside (Flower rewrites it)."""
    import shutil

    checkout, fab = tmp_path / "checkout", tmp_path / "fab"
    for root in (checkout,):
        (root / "pflower").mkdir(parents=True)
        (root / "pflower" / "__init__.py").write_text("")
        (root / "strategies").mkdir()
        (root / "strategies" / "a.py").write_text("x = 1\n")
        (root / "pyproject.toml").write_text('requires = ["a", "b"]\n')
    git(checkout, "init", "-q")
    git(checkout, "add", ".")
    git(checkout, "commit", "-qm", "one")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True).stdout.strip()
    shutil.copytree(checkout, fab, ignore=shutil.ignore_patterns(".git"))
    (fab / "pyproject.toml").write_text('requires = [\n    "a",\n    "b",\n]\n')  # as Flower writes it
    monkeypatch.setattr(prov, "_candidate_checkouts", lambda: [tmp_path / "elsewhere", checkout])
    state = prov.git_state(fab)
    assert (state["git_commit"], state["git_dirty"]) == (head, False) and str(checkout) in state["git_commit_of"]
    (checkout / "strategies" / "a.py").write_text("x = 2\n")  # the checkout moved on: not the FAB's code
    assert prov.git_state(fab) == {"git_commit": None, "git_dirty": None}
    (fab / "strategies" / "a.py").write_text("x = 2\n")  # built from the edited tree: dirty
    assert prov.git_state(fab)["git_dirty"] is True


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_a_run_writes_provenance_and_a_resume_appends(compose, tiny_overrides, monkeypatch):
    monkeypatch.setattr(prov, "git_state", lambda root=None: {"git_commit": "a" * 40, "git_dirty": False})
    summary = run_experiment(InProcessGrid(4), compose(*tiny_overrides, "method=fedavg", "rounds=2"))
    run_dir = Path(summary["run_dir"])
    data = json.loads((run_dir / "provenance.json").read_text())
    assert data["git_commit"] == "a" * 40 and data["resumes"] == []
    assert data["started"][:4].isdigit() and isinstance(data["argv"], list) and data["flwr"] and data["torch"]
    assert prov.short_commit(run_dir) == "aaaaaaa"

    monkeypatch.setattr(prov, "git_state", lambda root=None: {"git_commit": "b" * 40, "git_dirty": True})
    run_experiment(InProcessGrid(4), compose(f"resume={run_dir}", "rounds=3"))
    data = json.loads((run_dir / "provenance.json").read_text())
    assert data["git_commit"] == "a" * 40  # where the run started
    assert [(r["git_commit"], r["after_round"]) for r in data["resumes"]] == [("b" * 40, 2)]


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_report_lists_each_runs_commit(compose, tiny_overrides, monkeypatch, tmp_path):
    monkeypatch.setattr(prov, "git_state", lambda root=None: {"git_commit": "c" * 40, "git_dirty": True})
    run = Path(run_experiment(InProcessGrid(4), compose(*tiny_overrides, "method=fedavg", "rounds=1"))["run_dir"])
    old = run.parent / "older-run"  # a run from before provenance.json: no commit, no error
    subprocess.run(["cp", "-r", str(run), str(old)], check=True)
    (old / "provenance.json").unlink()
    (old / "provenance.json.tmp").write_text("")  # stray temp file is ignored too
    md = (write_report([run, old], tmp_path / "rep")[0]).read_text()
    listed = [line for line in md.splitlines() if line.startswith("- ")]
    assert len(listed) == 2 and sum(", commit ccccccc+dirty): `" in line for line in listed) == 1
    assert all("(seed " in line for line in listed)  # both have a config.yaml; only one a provenance.json


def test_flower_run_fab_is_recorded():
    """Under `flwr run` the code runs from the FAB (no .git): the FAB hash names it."""
    from flwr.supercore.run import Run

    class Grid:
        run = Run.create_empty(7)

    Grid.run.fab_id, Grid.run.fab_version, Grid.run.fab_hash = "pflower/pflower", "0.1.0", "f" * 64
    assert prov.flwr_run(Grid()) == {
        "run_id": 7,
        "fab_id": "pflower/pflower",
        "fab_version": "0.1.0",
        "fab_hash": "f" * 64,
    }
    assert prov.flwr_run(InProcessGrid(2)) is None and prov.flwr_run(None) is None


def test_unreadable_provenance_is_treated_as_not_recorded(tmp_path):
    (tmp_path / "provenance.json").write_text("{not json")
    assert prov.read_provenance(tmp_path) is None and prov.short_commit(tmp_path) is None


def test_no_secret_of_the_command_line_reaches_any_file_a_run_writes(compose, tiny_overrides, monkeypatch):
    """Under `flwr run` the ServerApp process is Flower's `flwr-serverapp ... --token <token>`:
    provenance.json records the command with every secret-bearing value redacted."""
    token = "tok-3f9a7c21e5"
    argv = [
        "flwr-serverapp",
        "--serverappio-api-address",
        "127.0.0.1:9091",
        "--token",
        token,
        f"--superexec-auth-secret={token}",
        "--root-certificates",
        f"/certs/{token}.pem",
        "--run-once",
    ]
    assert prov.safe_argv(argv) == [
        "flwr-serverapp",
        "--serverappio-api-address",
        "127.0.0.1:9091",
        "--token",
        "<redacted>",
        "--superexec-auth-secret=<redacted>",
        "--root-certificates",
        "<redacted>",
        "--run-once",
    ]
    monkeypatch.setattr("sys.argv", argv)
    summary = run_experiment(InProcessGrid(4), compose(*tiny_overrides, "method=fedavg", "rounds=1"))
    files = [p for p in Path(summary["run_dir"]).rglob("*") if p.is_file()]
    assert any(p.name == "provenance.json" for p in files)
    for path in files:
        assert token.encode() not in path.read_bytes(), path


def test_provenance_names_the_copy_of_the_code_that_ran(tmp_path):
    """A checkout, an unpacked FAB (the same tree without .git) and an installed wheel are told apart."""
    import pflower

    assert prov.code_origin() == {"code_root": str(pflower.SOURCE_ROOT), "code_from": "checkout"}
    fab = tmp_path / "fab"
    (fab / "pflower").mkdir(parents=True)
    (fab / "pflower" / "__init__.py").write_text("")
    assert prov.code_origin(fab) == {"code_root": str(fab), "code_from": "fab"}
    wheel = tmp_path / "site-packages" / "pflower"
    (wheel / "strategies").mkdir(parents=True)
    assert prov.code_origin(wheel)["code_from"] == "installed"
    assert {"code_root", "code_from"} <= set(prov.provenance(argv=["x"]))
