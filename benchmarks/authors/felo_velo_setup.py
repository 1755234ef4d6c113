"""Make the Felo/Velo authors' code run, with every change to it listed here.

    python -m benchmarks.authors.felo_velo_setup <exported repo> [--fmnist DIR] [--decompyle3 PATH]
        [--partition FILE]

The code: github ChanYunHin/Felo_Velo at commit 33eaa18 (``git archive`` of it into a folder).
It cannot run as committed: ``modules/Model.py``, ``old_Model.py``, ``utils.py`` and
``GAN_model.py``, which every client and server imports, are committed only as CPython 3.8
bytecode (``modules/__pycache__``). This script

1. recovers them with decompyle3 (``pip install decompyle3``, any venv: it is run as a
   program) and applies the two fixes its output needs (:data:`RECOVERY_FIXES`);
2. applies :data:`EDITS`, each a (file, old text, new text, why); an edit whose old text is
   not in its file exactly once stops the set-up and names the edit, so a different commit
   cannot be patched silently;
3. unpacks Fashion-MNIST's IDX files into ``data/FashionMNIST/raw`` (torchvision's layout:
   the code's ``download=True`` then finds them and downloads nothing) and makes the
   ``state_dict/`` folder the servers save client models into.

Running it twice is harmless: a file already recovered or edited is left as it is.
docs/authors-code.md ("Felo and Velo") has the recipe and what the code does differently.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: modules committed only as bytecode, recovered into ``modules/<name>.py``
RECOVERED = ("Model", "old_Model", "utils", "GAN_model")
#: Fashion-MNIST's IDX files (gzipped in the Debian package)
FMNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@dataclass(frozen=True)
class Edit:
    path: str
    old: str
    new: str
    why: str


_NO_SELECT = "`numpy.lib.function_base` is gone in NumPy 2; the name is never used"
_EVAL = (
    "evaluate every `--eval_every` iterations (and after the last one) instead of every 1/100 of "
    "them: an evaluation runs all 10 client models over the whole test set and dominates a CPU "
    "run; the default (no flag) is the code's own schedule"
)
_EVAL_OLD = "            if ep % eval_interval == 0:\n"
_EVAL_NEW = (
    "            if args.eval_every:\n"
    "                eval_interval = 1 if (ep % args.eval_every == 0 or ep == max_training_epoches - 1) "
    "else max_training_epoches + 1\n"
    "            if ep % eval_interval == 0:\n"
)

_SEED_FLAG = "parser.add_argument('--seed', type=int, default=None, help='seed numpy and torch first')\n"
_EVAL_FLAG = "parser.add_argument('--eval_every', type=int, default=0, help='iterations between evaluations')\n"
_VAE = (
    "Velo's server retrains its CVAE every `--vae_every` iterations after the warm-up for "
    "`--vae_epochs` epochs, instead of every 1/100 of the iterations for 10: the code's schedule is "
    "about 950,000 CVAE steps in a 200-iteration run, more GPU time than a task is lent here; without "
    "the flags the code's own schedule runs"
)
_VAE_OLD = (
    "                    if ep >= int(max_training_epoches * 0.05) and ep % int(max_training_epoches * 0.01) == 0:\n"
    "                        distillation_flag = args.y_distillation_flag\n"
    "                        #training\n"
    "                        features_dataloader = self.get_server_client_features(res)\n"
    "                        self.server_extractor = CVAE.server_extractor_training(self.server_extractor,\n"
    "                                                                               num_epochs=10,\n"
)
_VAE_NEW = (
    "                    if ep >= int(max_training_epoches * 0.05) and "
    "ep % (args.vae_every or int(max_training_epoches * 0.01)) == 0:\n"
    "                        distillation_flag = args.y_distillation_flag\n"
    "                        #training\n"
    "                        features_dataloader = self.get_server_client_features(res)\n"
    "                        self.server_extractor = CVAE.server_extractor_training(self.server_extractor,\n"
    "                                                                               num_epochs=args.vae_epochs,\n"
)

EDITS: tuple[Edit, ...] = (
    Edit("modules/Server_op.py", "from numpy.lib.function_base import select\n", "", _NO_SELECT),
    Edit("modules/Server_new_VAE.py", "from numpy.lib.function_base import select\n", "", _NO_SELECT),
    Edit("modules/Client_op.py", "from numpy.lib.function_base import gradient\n", "", _NO_SELECT),
    Edit("modules/Client_new_VAE.py", "from numpy.lib.function_base import gradient\n", "", _NO_SELECT),
    Edit(
        "modules/ResnetModel.py",
        "from tkinter import X\n",
        "",
        "an unused import (an editor's auto-import) that fails where Python has no Tk (servers, containers)",
    ),
    Edit(
        "parameters.py",
        "args = parser.parse_args()\n",
        _SEED_FLAG + _EVAL_FLAG + "args = parser.parse_args()\n",
        "two flags for the edits below; without them the code runs as committed",
    ),
    Edit(
        "main.py",
        "    Server = server(parameters)\n",
        "    if args.seed is not None:\n"
        "        import numpy as np\n"
        "        np.random.seed(args.seed)\n"
        "        torch.manual_seed(args.seed)\n"
        "    Server = server(parameters)\n",
        "the code seeds nothing; `--seed` fixes the initial weights, the client draws and the "
        "batch order. Runs still differ: every iteration reseeds torch from the OS "
        "(`get_random_seed`, `torch.random.seed()`), so dropout masks (and Velo's noise) are not repeatable",
    ),
    Edit("modules/Server_op.py", _EVAL_OLD, _EVAL_NEW, _EVAL),
    Edit("modules/Server_new_VAE.py", _EVAL_OLD, _EVAL_NEW, _EVAL),
    Edit(
        "parameters.py",
        _SEED_FLAG,
        "parser.add_argument('--vae_every', type=int, default=0, help='iterations between CVAE trainings')\n"
        "parser.add_argument('--vae_epochs', type=int, default=10, help='epochs a CVAE training')\n" + _SEED_FLAG,
        "two flags for Velo's CVAE schedule (the edit below); without them the code's own schedule runs",
    ),
    Edit("modules/Server_new_VAE.py", _VAE_OLD, _VAE_NEW, _VAE),
)

RECOVERY_FIXES = {
    "utils": (
        "decompyle3 nests everything after the scheduler branch of `get_model_mask` (and its "
        "`return`) inside `if args.enable_scheduler:`, so without that flag it returns None and "
        "`get_tb_logs_name` fails; the fix dedents it (it only names the log folder)"
    ),
    "GAN_model": (
        "decompyle3 cannot decompile `training_loop`; the file is cut before it. Nothing calls it "
        "(`Client_new_VAE.py` imports the module; its one use is commented out)"
    ),
}


class SetupError(RuntimeError):
    """The set-up cannot go on; the message says what to fix."""


def decompiled_source(output: str) -> str:
    """The Python source in decompyle3's output, without the parser trace before it."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"(import |from |def |class )", line) and "::=" not in line:
            body = [x for x in lines[i:] if not x.startswith("# okay decompiling")]
            return "\n".join(body).rstrip() + "\n"
    raise SetupError("decompyle3 printed no source (no import, def or class line)")


def fix_recovered(name: str, source: str) -> str:
    """Apply :data:`RECOVERY_FIXES` to one recovered module's source."""
    if name == "utils":
        out, inside = [], False
        for line in source.split("\n"):
            if line.startswith("        if args.softmax_flag:"):
                inside = True
            elif line.startswith("def get_tb_logs_name"):
                inside = False
            out.append(line[4:] if inside and line.startswith("        ") else line)
        return "\n".join(out)
    if name == "GAN_model":
        cut = source.find("def training_loop")
        return source if cut < 0 else source[:cut].rstrip() + "\n"
    return source


def recover(repo: Path, decompyle3: str) -> list[str]:
    """Write ``modules/<name>.py`` for each of :data:`RECOVERED` that is missing; the names written."""
    written = []
    for name in RECOVERED:
        target = repo / "modules" / f"{name}.py"
        if target.exists():
            continue
        pyc = repo / "modules" / "__pycache__" / f"{name}.cpython-38.pyc"
        if not pyc.exists():
            raise SetupError(f"{pyc} is missing: export the repository at commit 33eaa18 with its __pycache__")
        try:
            done = subprocess.run([decompyle3, str(pyc)], capture_output=True, text=True, check=False)
        except FileNotFoundError as exc:
            raise SetupError(f"{decompyle3} not found: `pip install decompyle3`, or pass --decompyle3 PATH") from exc
        source = fix_recovered(name, decompiled_source(done.stdout))
        compile(source, str(target), "exec")  # a SyntaxError names the line to look at
        target.write_text(source)
        written.append(name)
    return written


def apply_edits(repo: Path, edits: tuple[Edit, ...] = EDITS) -> list[str]:
    """Apply each edit whose new text is not there yet; the edits applied, as ``path: why``."""
    applied = []
    for edit in edits:
        path = repo / edit.path
        if not path.exists():
            raise SetupError(f"{edit.path} is missing: is {repo} the Felo_Velo repository at 33eaa18?")
        with path.open(newline="") as f:  # keep the file's own line endings (the repository mixes them)
            text = f.read()
        eol = "\r\n" if "\r\n" in text else "\n"
        old, new = edit.old.replace("\n", eol), edit.new.replace("\n", eol)
        if new and new in text:
            continue
        count = text.count(old)
        if count == 0 and not new:
            continue  # a removal already made
        if count != 1:
            raise SetupError(f"{edit.path}: the text to replace occurs {count} times, not once ({edit.why})")
        with path.open("w", newline="") as f:
            f.write(text.replace(old, new))
        applied.append(f"{edit.path}: {edit.why}")
    return applied


def unpack_fmnist(repo: Path, source: Path) -> None:
    """Fashion-MNIST's four IDX files, unzipped where torchvision's FashionMNIST looks."""
    raw = repo / "data" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for stem in FMNIST_FILES:
        if (raw / stem).exists():
            continue
        packed = source / f"{stem}.gz"
        if not packed.exists():
            raise SetupError(f"{packed} is missing: install dataset-fashion-mnist (Debian) or pass --fmnist DIR")
        with gzip.open(packed) as src, (raw / stem).open("wb") as dst:
            shutil.copyfileobj(src, dst)
    (repo / "state_dict").mkdir(exist_ok=True)


def write_partition(path: Path, clients: int = 10, train: int = 60_000, test: int = 10_000) -> None:
    """pflower's ``partition=file`` of the code's IID split: client i trains on the i-th contiguous
    tenth of the training split (``Dataset.py:369-372``) and tests on the i-th tenth of the test
    split (pooled indices: train, then test). The code scores every model on the whole test split;
    the mean over the clients of these tenths estimates the same number."""
    step, test_step = train // clients, test // clients
    split = [
        {
            "train": list(range(i * step, (i + 1) * step)),
            "test": list(range(train + i * test_step, train + (i + 1) * test_step)),
        }
        for i in range(clients)
    ]
    path.write_text(json.dumps({"clients": split}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", type=Path)
    parser.add_argument("--fmnist", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    parser.add_argument("--decompyle3", default="decompyle3")
    parser.add_argument("--partition", type=Path, help="also write pflower's partition file of the code's split here")
    args = parser.parse_args(argv)
    if args.partition:
        write_partition(args.partition)
        print(f"wrote {args.partition}: pflower sim experiment=authors_felo_fmnist partition.path={args.partition}")
    try:
        for name in recover(args.repo, args.decompyle3):
            print(f"recovered modules/{name}.py" + (f" ({RECOVERY_FIXES[name]})" if name in RECOVERY_FIXES else ""))
        for line in apply_edits(args.repo):
            print(f"edited {line}")
        unpack_fmnist(args.repo, args.fmnist)
    except SetupError as exc:
        raise SystemExit(f"felo_velo_setup: {exc}") from None
    print(f"{args.repo} is ready: see docs/authors-code.md (Felo and Velo) for the runs")


if __name__ == "__main__":
    main()
