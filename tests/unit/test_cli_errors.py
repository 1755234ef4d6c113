"""Bad input to `pflower sim` ends in one line naming the key, the bad value and the fix, exit
status 2, before Ray starts and before any run directory exists (issue 16, item 1: the
`pflower sim` half; the `flwr run` half is listed as open in the README)."""

import pytest

from server_app.cli import main

CASES = [
    (["lr=abc"], ["lr='abc' is not a number", "lr=0.05"]),
    (["rounds=2.5"], ["rounds=2.5 is not a whole number"]),
    (["rouns=5"], ["unknown key 'rouns'", "did you mean rounds?"]),
    (["method.kpp=3"], ["unknown key 'method.kpp'", "did you mean method.kp?"]),
    (["method=nosuch"], ["unknown method 'nosuch'", "fedavg", "kapc"]),
    (["model=nosuch"], ["unknown model 'nosuch'", "lenet5"]),
    (["-m", "method=fedavg,nosuch"], ["unknown method 'nosuch'"]),  # every value of a sweep is checked
    (["method=fedcmd", "rounds=3"], ["FedCMD kp=20 leaves no phase-2 round", "set method.kp below rounds"]),
    (["method=fedcpmd", "method.kp=5", "method.distance=kl"], ["distance", "js"]),
    (["fraction=0"], ["fraction must be in (0, 1]"]),
    (["alpha=-1"], ["alpha must be > 0"]),
]


@pytest.mark.parametrize("args, expected", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_setting_is_one_line_with_the_fix_and_exit_2(args, expected, tmp_path, capsys):
    out = tmp_path / "outputs"
    assert main(["sim", *args, f"output_dir={out}", "num_clients=4", "dataset=digits"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("pflower: "), err
    for text in expected:
        assert text in err, err
    assert not out.exists()  # nothing half-made
