"""benchmarks/memory.py sees a child process's memory (the tree, not only this process)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.memory import PeakMemory, process_tree, tree_memory  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux /proc smaps_rollup")


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_peak_counts_a_childs_private_memory():
    before = tree_memory(os.getpid())["total"][1]
    code = "import time; b = bytearray(300 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); time.sleep(3)"
    with PeakMemory(interval=0.1) as peak:
        child = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(1.5)
        assert child.pid in process_tree(peak.root)
        child.wait()
    assert peak.peak_pss - before > 250e6  # the child's 300 MB, split to nobody else
    assert peak.at_peak["other"][1] > 250e6 and peak.peak_rss >= peak.peak_pss


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_the_command_benchmark_measures_a_real_pflower_sim(tmp_path):
    """`python -m benchmarks.memory` on a tiny serial run: one row, a plausible peak."""
    from benchmarks.memory import main

    out = tmp_path / "memory.md"
    args = [
        "--backends",
        "serial",
        "--repeats",
        "1",
        "--out",
        str(out),
        "method=fedavg",
        "num_clients=3",
        "rounds=1",
        "local_epochs=1",
        "partition.min_size=20",
        "alpha=1.0",
    ]
    assert main(args) == 0
    text = out.read_text()
    row = [line for line in text.splitlines() if line.startswith("| 1 | serial |")]
    assert len(row) == 1
    pss = float(row[0].split("|")[4].split()[0])
    assert 0.1 < pss < 5.0  # GB: torch alone is a few hundred MB
