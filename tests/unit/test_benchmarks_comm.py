"""benchmarks/communication.py on a seconds-long workload: the table is built from the real messages."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ is a folder of the checkout, not an installed package

from benchmarks import communication as comm  # noqa: E402


def test_messages_measured_and_fedper_sends_less():
    runs = {r["method"]: r for r in comm.benchmark(["fedavg", "fedper"], 1, comm.QUICK, progress=False)}
    for run in runs.values():
        assert not comm.check_accounting(run)
        kinds = [b.kind for b in run["batches"]]
        assert kinds == ["query", "train", "evaluate"]  # discovery, one round, the final evaluation
        for batch in run["batches"]:
            assert batch.down and len(batch.up) == len(batch.down)
            for size in (*batch.down, *batch.up):
                assert size.wire >= size.arrays and size.proto >= size.arrays
        train = run["batches"][1]
        assert sum(s.arrays for s in train.down) == run["history"][0]["bytes_down"]
        assert sum(s.arrays for s in train.up) == run["history"][0]["bytes_up"]
    up = {m: comm._phase_numbers(r, [1])["up_client"] for m, r in runs.items()}
    down = {m: comm._phase_numbers(r, [1])["down_client"] for m, r in runs.items()}
    assert up["fedper"] < up["fedavg"] and down["fedper"] < down["fedavg"]  # the classifier stays home
    rows = comm.round_rows(list(runs.values()))
    assert [r["method"] for r in rows] == ["fedavg", "fedper"]
    assert rows[0]["down ×fedavg"] == "1.00" and float(rows[1]["up ×fedavg"]) < 1.0
    text = comm.report(list(runs.values()), "python -m benchmarks.communication --quick", 0.0, 1, comm.QUICK)
    assert "| fedavg | round 1 |" in text and "| fedper | round 1 |" in text and "Commit:" in text
    assert "equal the captured messages' array bytes" in text
