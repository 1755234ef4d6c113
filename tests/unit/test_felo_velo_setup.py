"""benchmarks/authors/felo_velo_setup.py: the recovered modules' fixes and the listed edits."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from benchmarks.authors import felo_velo_setup as setup
from benchmarks.authors.felo_velo_setup import Edit, SetupError

TRACE_THEN_SOURCE = """\
# decompyle3 version 3.9.3
               expr ::= LOAD_CODE (1)
import_from ::= LOAD_CONST . LOAD_CONST IMPORT_NAME importlist POP_TOP
import torch
from torch import nn

class Net(nn.Module):
    pass

# okay decompiling Model.cpython-38.pyc
"""

UTILS = """\
def get_model_mask(args):
    model_mask = "SGD5"
    if args.enable_scheduler:
        if args.op_agg:
            model_mask += "_step"
        if args.softmax_flag:
            model_mask += "_softmaxLg"
        if args.op:
            model_mask += "_op"
        return model_mask


def get_tb_logs_name(args):
    return "./tb_logs/" + get_model_mask(args)
"""


def test_the_source_starts_after_the_parser_trace() -> None:
    source = setup.decompiled_source(TRACE_THEN_SOURCE)
    assert source.startswith("import torch\n")
    assert "::=" not in source and "okay decompiling" not in source
    compile(source, "Model.py", "exec")


def test_output_without_source_is_an_error() -> None:
    with pytest.raises(SetupError, match="no source"):
        setup.decompiled_source("expr ::= LOAD_CODE (1)\n")


def test_utils_fix_returns_a_mask_without_the_scheduler_flag() -> None:
    class Args:
        enable_scheduler, op_agg, softmax_flag, op = False, False, True, True

    broken: dict = {}
    exec(UTILS, broken)
    assert broken["get_model_mask"](Args) is None  # what decompyle3's nesting gives

    fixed: dict = {}
    exec(setup.fix_recovered("utils", UTILS), fixed)
    assert fixed["get_model_mask"](Args) == "SGD5_softmaxLg_op"
    assert fixed["get_tb_logs_name"](Args) == "./tb_logs/SGD5_softmaxLg_op"


def test_gan_model_is_cut_before_the_function_decompyle3_cannot_read() -> None:
    source = "def makedirs(path):\n    pass\n\n\ndef training_loopParse error at or near `LOAD_GLOBAL'\n"
    assert setup.fix_recovered("GAN_model", source) == "def makedirs(path):\n    pass\n"
    assert setup.fix_recovered("Model", source) == source


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "modules").mkdir()
    (tmp_path / "main.py").write_bytes(b"import torch\r\n    Server = server(parameters)\r\n    Server.run()\r\n")
    (tmp_path / "modules" / "a.py").write_bytes(b"import numpy\nfrom numpy.lib.function_base import select\nx = 1\n")
    return tmp_path


EDITS = (
    Edit("modules/a.py", "from numpy.lib.function_base import select\n", "", "numpy 2"),
    Edit("main.py", "    Server = server(parameters)\n", "    seed()\n    Server = server(parameters)\n", "seed"),
)


def test_edits_keep_each_files_line_endings_and_run_once(tmp_path: Path) -> None:
    repo = _tree(tmp_path)
    applied = setup.apply_edits(repo, EDITS)
    assert applied == ["modules/a.py: numpy 2", "main.py: seed"]
    assert (repo / "modules" / "a.py").read_bytes() == b"import numpy\nx = 1\n"
    assert (repo / "main.py").read_bytes() == (
        b"import torch\r\n    seed()\r\n    Server = server(parameters)\r\n    Server.run()\r\n"
    )
    assert setup.apply_edits(repo, EDITS) == []  # a second run changes nothing
    assert (repo / "main.py").read_bytes().count(b"seed()") == 1


def test_an_edit_that_does_not_match_stops_and_names_itself(tmp_path: Path) -> None:
    repo = _tree(tmp_path)
    (repo / "main.py").write_text("    Server = server(parameters)\n    Server = server(parameters)\n")
    with pytest.raises(SetupError, match=r"main\.py: the text to replace occurs 2 times, not once \(seed\)"):
        setup.apply_edits(repo, EDITS)
    with pytest.raises(SetupError, match="missing"):
        setup.apply_edits(repo, (Edit("nope.py", "a", "b", "why"),))


def test_every_shipped_edit_names_a_file_of_the_repository() -> None:
    for edit in setup.EDITS:
        assert edit.path in {"main.py", "parameters.py"} or edit.path.startswith("modules/")
        assert edit.old and edit.why


def test_fmnist_is_unpacked_where_torchvision_looks(tmp_path: Path) -> None:
    source = tmp_path / "fmnist"
    source.mkdir()
    for stem in setup.FMNIST_FILES:
        with gzip.open(source / f"{stem}.gz", "wb") as f:
            f.write(stem.encode())
    repo = tmp_path / "repo"
    repo.mkdir()
    setup.unpack_fmnist(repo, source)
    assert (repo / "data" / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte").read_bytes() == b"t10k-labels-idx1-ubyte"
    assert (repo / "state_dict").is_dir()
    with pytest.raises(SetupError, match="dataset-fashion-mnist"):
        setup.unpack_fmnist(tmp_path / "other", tmp_path / "empty")


def test_the_partition_file_is_the_codes_contiguous_tenths(tmp_path: Path) -> None:
    path = tmp_path / "part.json"
    setup.write_partition(path, clients=2, train=4, test=2)
    assert json.loads(path.read_text()) == {"clients": [{"train": [0, 1], "test": [4]}, {"train": [2, 3], "test": [5]}]}


def _shipped(path: str) -> tuple[Edit, ...]:
    return tuple(e for e in setup.EDITS if e.path == path)


def test_the_cvae_flags_keep_the_codes_schedule_unless_given(tmp_path: Path) -> None:
    """The shipped edits on the two places they change (parameters.py; Server_new_VAE.py's schedule,
    CRLF as committed): every flag is added once, and the edited condition trains the CVAE at the
    code's iterations without the flags (every 1/100 of them from the 5 % warm-up) and at
    ``--vae_every`` with it."""
    import argparse

    (tmp_path / "modules").mkdir()
    (tmp_path / "parameters.py").write_text(
        "import argparse\nparser = argparse.ArgumentParser()\nargs = parser.parse_args()\n"
    )
    server = tmp_path / "modules" / "Server_new_VAE.py"
    server.write_bytes(("for ep in range(n):\n" + setup._VAE_OLD).replace("\n", "\r\n").encode())
    setup.apply_edits(tmp_path, _shipped("parameters.py") + _shipped("modules/Server_new_VAE.py")[-1:])
    assert setup.apply_edits(tmp_path, _shipped("parameters.py")) == []  # a second run adds nothing
    parameters = (tmp_path / "parameters.py").read_text()
    for flag in ("--seed", "--eval_every", "--vae_every", "--vae_epochs"):
        assert parameters.count(f"'{flag}'") == 1

    parser_ns: dict = {}
    exec(parameters.replace("args = parser.parse_args()\n", ""), parser_ns)
    condition = server.read_bytes().decode().split("\r\n")[1].strip().removeprefix("if ").removesuffix(":")
    assert "num_epochs=args.vae_epochs" in server.read_bytes().decode()

    def trainings(argv: list[str]) -> list[int]:
        args: argparse.Namespace = parser_ns["parser"].parse_args(argv)
        scope = {"args": args, "max_training_epoches": 200}
        return [ep for ep in range(200) if eval(condition, {**scope, "ep": ep})]  # noqa: S307 - the edit's own text

    assert trainings([]) == list(range(10, 200, 2))  # the code's: 95 trainings
    assert trainings(["--vae_every", "10"]) == list(range(10, 200, 10))
    assert parser_ns["parser"].parse_args([]).vae_epochs == 10
