"""A copy of this checkout's tracked files, for tests that act on a second tree (a user's copy, a
branch): the committed result runs are left out, and one placeholder stays in docs/results/ so
`flwr run` still finds the files its FAB exclude pattern names."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def copy_repository(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for rel in files:
        if rel.startswith("docs/results/") or not (ROOT / rel).is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    (dest / "docs" / "results").mkdir(parents=True, exist_ok=True)
    (dest / "docs" / "results" / "README.md").write_text("runs\n")
    return dest
