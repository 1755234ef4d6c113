"""benchmarks/gpu.py reads nvidia-smi's answers: checked on its output format and, end to end, on
a stand-in nvidia-smi (CI has no GPU)."""

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import gpu  # noqa: E402


def test_the_device_line_and_the_process_lines_are_parsed():
    assert gpu.parse_gpu("81559, 37\n") == (81559, 37)
    assert gpu.parse_gpu("512, 0\n1024, 100\n") == (512, 0)  # the first GPU
    assert gpu.parse_apps("4242, 518\n4243, 530\n") == {4242: 518, 4243: 530}
    assert gpu.parse_apps("") == {}
    assert gpu.parse_apps("No running processes found\n") == {}


def test_the_sampler_keeps_peaks_and_the_mean_utilisation(tmp_path, monkeypatch):
    """A stand-in nvidia-smi whose answers change from call to call (a counter file)."""
    counter = tmp_path / "n"
    counter.write_text("0")
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        f'n=$(cat {counter}); case "$1" in\n'
        "  --query-gpu=*) n=$((n+1)); echo $n > "
        + str(counter)
        + '; if [ $n -eq 1 ]; then echo "1000, 20"; else echo "3000, 60"; fi ;;\n'
        '  --query-compute-apps=*) if [ $n -eq 1 ]; then echo "11, 500"; else printf "11, 520\\n12, 900\\n"; fi ;;\n'
        "esac\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert gpu.available()
    with gpu.GpuPeak(interval=0.05) as peak:
        deadline = time.time() + 10
        while len(peak.utilisation) < 3 and time.time() < deadline:
            time.sleep(0.05)
    assert peak.utilisation[:2] == [20, 60]
    assert peak.peak_used_mib == 3000 and peak.peak_processes == 2 and peak.peak_process_mib == 900
    assert 20 < peak.mean_utilisation <= 60


def test_without_nvidia_smi_nothing_is_sampled(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not gpu.available()
    with gpu.GpuPeak(interval=0.01) as peak:
        time.sleep(0.05)
    assert peak.utilisation == [] and peak.mean_utilisation is None and peak.peak_used_mib == 0
