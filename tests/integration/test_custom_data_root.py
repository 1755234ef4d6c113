"""``dataset=custom`` as a new user writes it (issue 58): a package in the current directory, a data
function ``load(root)`` returning torchvision's ImageFolder, ``dataset.root`` naming the images.
The console script finds the package as ``python -m`` would, the function receives ``root``, and a
function that raises is one ``pflower:`` line naming it and what it was given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.slow  # three `pflower sim` processes
BIN = Path(sys.executable).parent


def user_folder(tmp_path: Path) -> Path:
    """40 PNG images in two class folders, and ``mypkg/data.py`` beside them."""
    rng = np.random.default_rng(0)
    for c in range(2):
        (tmp_path / "imgs" / f"class{c}").mkdir(parents=True)
        for i in range(20):
            pixels = (rng.random((28, 28)) * 100 + 120 * c).astype(np.uint8)
            Image.fromarray(pixels).save(tmp_path / "imgs" / f"class{c}" / f"{i}.png")
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "data.py").write_text(
        "from torchvision.datasets import ImageFolder\n\n\ndef load(root):\n    return ImageFolder(root)\n"
    )
    (tmp_path / "mypkg" / "broken.py").write_text("def load(root):\n    raise OSError('no camera at ' + root)\n")
    return tmp_path


def sim(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(BIN / "pflower"), "sim", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_an_image_folder_function_in_the_current_directory_gets_root(tmp_path):
    folder = user_folder(tmp_path)
    common = ["dataset=custom", f"dataset.root={folder / 'imgs'}", "method=fedavg", "rounds=2"]
    proc = sim(folder, *common, "dataset.options.target=mypkg.data:load", "num_clients=4", "partition.min_size=5")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run_dir = next((folder / "outputs").glob("*/*-fedavg-custom"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_clients"] == 4 and summary["data_dir"] == "function mypkg.data:load"
    assert f"root: {folder / 'imgs'}" in (run_dir / "config.yaml").read_text()

    # too few images for the default 20 clients: the line says what to lower
    proc = sim(folder, *common, "dataset.options.target=mypkg.data:load")
    assert proc.returncode == 2 and "lower num_clients or partition.min_size" in proc.stderr
    assert "Traceback" not in proc.stderr

    # the user's function raising: one line with what it was called with
    proc = sim(folder, *common, "dataset.options.target=mypkg.broken:load", "num_clients=4")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("pflower: dataset.options.target='mypkg.broken:load' raised OSError: no camera at")
    assert f"root='{folder / 'imgs'}'" in line

    # run from elsewhere, the package is not found: the line says how to make it importable
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = sim(elsewhere, *common, "dataset.options.target=mypkg.data:load", "num_clients=4")
    assert proc.returncode == 2 and "set PYTHONPATH to that directory" in proc.stderr
