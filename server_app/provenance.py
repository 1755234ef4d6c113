"""Where a run came from: the code's git commit, the command, the date and the software versions.

Written to ``<run_dir>/provenance.json`` when a run starts (a resume appends to ``resumes``), so a
committed result names the commit it came from without anyone writing it down by hand.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import pflower

from .results import atomic_write

# the code that runs: a checkout or an unpacked FAB (the folder holding server_app/, ...), or the
# installed package (site-packages/pflower)
SOURCE_ROOT = pflower.SOURCE_ROOT
PACKAGES = ("flwr", "torch", "numpy")
# what decides a run's result; an edited README or a results folder does not make a run "dirty"
CODE_PATHS = (*pflower.PARTS, "pflower", "pyproject.toml")
#: the folders whose .py and .yaml files are a run's code (:func:`code_files`)
CODE_DIRS = ("pflower", *pflower.PARTS)


def code_files(root: Path) -> dict[str, bytes]:
    """``{relative path: contents}`` of the .py and .yaml files of :data:`CODE_DIRS` under ``root``."""
    out: dict[str, bytes] = {}
    for folder in CODE_DIRS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in (".py", ".yaml") and "__pycache__" not in path.parts and path.is_file():
                out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


def code_origin(root: Path = SOURCE_ROOT) -> dict[str, str]:
    """Which copy of pflower's code this process runs: ``code_root`` (its folder) and ``code_from``:
    ``checkout`` (a git work tree), ``fab`` (the FAB ``flwr run`` shipped, unpacked by Flower:
    a source tree without .git; ``flwr_run.fab_hash`` names its exact contents) or ``installed``
    (a wheel in site-packages)."""
    if (root / "pflower" / "__init__.py").is_file():
        source = "checkout" if _git(["rev-parse", "--show-toplevel"], root) is not None else "fab"
    else:
        source = "installed"
    return {"code_root": str(root), "code_from": source}


def _git(args: Sequence[str], cwd: Path) -> str | None:
    """``git <args>`` in ``cwd``; None where git is missing or ``cwd`` is no checkout (e.g. a wheel install)."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state(root: Path = SOURCE_ROOT) -> dict[str, Any]:
    """The commit of ``root`` and whether pflower's tracked code or config (:data:`CODE_PATHS`) differs
    from it. An unpacked FAB (``flwr run``) has no .git: its commit is that of the checkout it was
    built from (:func:`fab_checkout`), named in ``git_commit_of``."""
    commit = _git(["rev-parse", "HEAD"], root)
    if commit is None:
        checkout = fab_checkout(root)
        if checkout is None:
            return {"git_commit": None, "git_dirty": None}
        return {**git_state(checkout), "git_commit_of": f"the checkout the FAB was built from: {checkout}"}
    status = _git(["status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS], root)
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def _candidate_checkouts() -> list[Path]:
    """Where a FAB's checkout may be: the editable install's source folder (``pip install -e .``,
    read from its ``direct_url.json``) and the current directory."""
    found: list[Path] = []
    try:
        direct = metadata.distribution("pflower").read_text("direct_url.json")
        url = json.loads(direct or "{}").get("url", "")
        if url.startswith("file://"):
            found.append(Path(url.removeprefix("file://")))
    except (metadata.PackageNotFoundError, ValueError):
        pass
    found.append(Path.cwd())
    return found


def fab_checkout(fab_root: Path, candidates: Sequence[Path] | None = None) -> Path | None:
    """The git checkout whose working tree holds exactly the FAB's code (every .py and .yaml file of
    :func:`code_files` equal, none missing on either side; Flower rewrites
    pyproject.toml, so it is not compared), or None: then the FAB's hash alone names its code.
    Flower builds the FAB from that working tree, so its commit (and whether the tree was dirty)
    is the FAB's."""
    if not (fab_root / "pflower" / "__init__.py").is_file():
        return None
    fab = code_files(fab_root)
    for checkout in candidates if candidates is not None else _candidate_checkouts():
        if checkout.resolve() == fab_root.resolve() or _git(["rev-parse", "HEAD"], checkout) is None:
            continue
        if code_files(checkout) == fab:
            return checkout
    return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


# a command-line flag whose name holds one of these carries a secret (flwr-serverapp's --token, a
# SuperExec auth secret, key and certificate paths); its value never reaches an output file
SECRET_WORDS = ("token", "secret", "key", "password", "passwd", "credential", "cert", "auth")
REDACTED = "<redacted>"


def safe_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of every secret-bearing flag (``--token X``, ``--token=X``) replaced."""
    out: list[str] = []
    hide_next = False
    for arg in map(str, argv):
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        secret = name.startswith("-") and any(w in name.lower() for w in SECRET_WORDS)
        if secret and eq:
            out.append(f"{name}={REDACTED}")
        else:
            out.append(arg)
            hide_next = secret
    return out


def provenance(argv: Sequence[str] | None = None, now: dt.datetime | None = None) -> dict[str, Any]:
    """This process's provenance record (secret command-line values redacted: :func:`safe_argv`)."""
    return {
        "started": (now or dt.datetime.now().astimezone()).isoformat(timespec="seconds"),
        "argv": safe_argv(sys.argv if argv is None else argv),
        **git_state(),
        **code_origin(),
        "pflower_version": _version("pflower"),
        "python": platform.python_version(),
        **{package: _version(package) for package in PACKAGES},
    }


def flwr_run(grid: Any) -> dict[str, Any] | None:
    """The Flower run's id and FAB: under ``flwr run`` the ServerApp runs from the unpacked FAB, which
    has no .git, so ``fab_hash`` is what names the exact code there."""
    try:
        run = grid.run
    except Exception:  # noqa: BLE001 - a grid without a run (tests, before set_run) has nothing to say
        return None
    fields = ("run_id", "fab_id", "fab_version", "fab_hash")
    if run is None or not all(hasattr(run, f) for f in fields):
        return None
    return {f: getattr(run, f) for f in fields}


def write_provenance(
    run_dir: Path, grid: Any = None, resumed_after_round: int | None = None, data: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write (or, for a resume, extend) ``run_dir/provenance.json``; returns what the file holds.

    ``data``: where the run's data was read (``federated_data.data_origin``), recorded when it
    starts so a run that stops early still names its data."""
    path = Path(run_dir) / "provenance.json"
    record = {**provenance(), "flwr_run": flwr_run(grid), **({"data": data} if data else {})}
    if resumed_after_round is None:
        data = {**record, "resumes": []}
    else:
        data = read_provenance(run_dir) or {"resumes": []}  # a run started before provenance existed
        data.setdefault("resumes", []).append({**record, "after_round": resumed_after_round})
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True))
    return data


def read_provenance(run_dir: Path) -> dict[str, Any] | None:
    """``run_dir/provenance.json``, or None where the run has none or it is unreadable."""
    try:
        data = json.loads((Path(run_dir) / "provenance.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def short_commit(run_dir: Path) -> str | None:
    """``abc1234`` (``abc1234+dirty`` where tracked files had changes), or None when not recorded."""
    data = read_provenance(run_dir)
    commit = data.get("git_commit") if data else None
    if not isinstance(commit, str):
        return None
    return commit[:7] + ("+dirty" if data.get("git_dirty") else "")
