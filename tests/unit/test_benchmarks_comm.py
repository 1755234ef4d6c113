"""benchmarks/communication.py on a seconds-long workload: the table is built from the real messages."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ is a folder of the checkout, not an installed package

from benchmarks import communication as comm  # noqa: E402
from benchmarks.common import median  # noqa: E402


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


def test_felo_s_class_knowledge_is_a_small_share_of_the_model():
    runs = comm.benchmark(["felo"], 2, comm.QUICK, progress=False)  # warm-up: ceil(0.05 * 2) = 1 round
    felo = runs[1]
    assert not comm.check_accounting(felo)
    # LeNet-5's last hidden layer is 84 wide: S [10, 84] + P [10, 10] float32 + M [10] uint8 down;
    # s, p and the counts n [10] int64 up, each array with its 128-byte .npy header; round 1 is the
    # warm-up (nothing down)
    down, up = 10 * 84 * 4 + 400 + 10 + 3 * 128, 10 * 84 * 4 + 400 + 80 + 3 * 128
    train = [b for b in felo["batches"] if b.kind == "train"]
    assert {s.extra for s in train[0].down} == {0} and {s.extra for s in train[1].down} == {down}
    assert {s.extra for b in train for s in b.up} == {up}
    rows = comm.extras_rows(runs)
    assert [(r["method"], r["rounds"]) for r in rows] == [("felo", "round 1"), ("felo", "round 2")]
    model = median(s.arrays - s.extra for s in train[1].down)
    assert rows[1]["extras / model tensors down / up"] == f"{100 * down / model:.3g}% / {100 * up / model:.3g}%"
    assert "## Extras against the model" in comm.report(runs, "x", 0.0, 2, comm.QUICK)
