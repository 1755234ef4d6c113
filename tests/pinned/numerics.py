"""Numerics that give the same bits on every x86-64 CPU, for the pinned numbers.

The libraries under torch and numpy pick their kernels by the CPU they run on: ATen's
vectorized kernels by instruction set (AVX2, AVX-512), oneDNN's convolutions by instruction set
and cache sizes, MKL by vendor and instruction set, OpenBLAS (numpy's and scipy's) by core type,
numpy's own loops by instruction set. Each choice sums in its own order, so the same run differs
in the last bits from one machine to the next, and a few rounds later in a clustering decision
(measured: every pinned case moved on an AMD EPYC against the numbers pinned on another
machine, FedTSDP's round-2 clusters among them). Here every library is held to one path that
every x86-64 CPU with AVX2 runs, so the numbers are a property of the code, not of the machine
(checked on one machine by holding MKL to AVX2 and to SSE4.2 and oneDNN to AVX2: all 26 cases
unchanged). On a second real CPU, an Intel Xeon with AVX-512 and AMX (a GPU machine's host, with
its own torch 2.11 and numpy/scipy against the torch 2.14.1 the numbers were pinned with), 22 of
the 26 cases were equal; FedTSDP's round-1 Hopkins statistic moved by 2.4e-9 (relative) and
Felo, Velo and FedHe (the cases that train with Adam) in round 1. With the library versions
different too, that run could not say whether the CPU or the versions moved them
(benchmarks/results/engines_gpu/h100_host_pinned_numbers.log). A later session's machine, an
Intel Xeon with AVX-512 and the pinned torch 2.14.1, moved the same three cases to the same
values: the CPU. The cause was Adam's square root: ATen takes a float tensor's ``sqrt`` from
MKL's vector library, whose last bit differs between its AVX-512 and AVX2 paths (and which
MKL_CBWR does not hold); compared under an emulated AVX2 CPU (``qemu-x86_64 -cpu Haswell``),
``torch.sqrt`` differed and a float64 square root rounded to float32 did not. Adam now takes
that one (``models.optim.exact_sqrt``), and the three cases were re-pinned with it. The servers
that train with Adam kept ``torch.optim.Adam`` until an AMD EPYC with AVX-512 (CI's machine on
2026-11-27) moved Velo (its CVAE) and FedGKT (its server model) in round 2: the old code gave
three different values of one Velo number on three CPUs (that EPYC, the machine that pinned it,
and qemu's Haswell). Both now train with ``models.optim.PlainAdam``, and their fingerprints on
that EPYC and under ``qemu-x86_64 -cpu Haswell`` are equal to the last bit (as are Felo's and
FedHe's); Velo and FedGKT were re-pinned.

A pytest plugin that imports numpy before ``tests/conftest.py`` runs makes :func:`apply` refuse
(seen on a machine image with many plugins): set the variables in the environment first, e.g.
``env $(python -m tests.pinned.numerics) pytest``.

The variables are read when the libraries load, so :func:`apply` must run before numpy or
torch is imported (tests/conftest.py does it first; ``python -m tests.pinned.cases`` too);
:func:`disable_mkldnn` needs torch and runs after.
"""

from __future__ import annotations

import os
import sys

PORTABLE = {
    "ATEN_CPU_CAPABILITY": "default",  # ATen's kernels as compiled for baseline x86-64
    "MKL_CBWR": "COMPATIBLE",  # MKL: the same code path on every CPU (conditional bitwise reproducibility)
    "OPENBLAS_CORETYPE": "Haswell",  # numpy's and scipy's OpenBLAS: the AVX2 kernels everywhere
    # numpy's own loops: no AVX-512 variants (machines without it use the AVX2 ones); X86_V4 is
    # numpy 2.4's name for its AVX-512 group (the older names alone left it on), earlier numpy ignores it
    "NPY_DISABLE_CPU_FEATURES": "X86_V4,AVX512F,AVX512CD,AVX512_SKX,AVX512_CLX,AVX512_CNL,AVX512_ICL,AVX512_SPR",
}


def apply() -> None:
    """Set the variables for this process and the ones it starts; refuse if it is too late."""
    loaded = [m for m in ("numpy", "torch") if m in sys.modules]
    wrong = {k: os.environ.get(k) for k, v in PORTABLE.items() if os.environ.get(k) != v}
    if loaded and wrong:
        raise RuntimeError(
            f"portable numerics must be set before {' and '.join(loaded)} is imported (unset: {sorted(wrong)}); "
            "a pytest plugin may have imported it first: set them in the environment, "
            "`env $(python -m tests.pinned.numerics) pytest`"
        )
    os.environ.update(PORTABLE)


def disable_mkldnn() -> None:
    """oneDNN's convolutions choose their blocking by the CPU's caches: use ATen's own instead."""
    import torch

    torch.backends.mkldnn.enabled = False


if __name__ == "__main__":  # the variables as KEY=VALUE words, for `env $(python -m tests.pinned.numerics) ...`
    print(" ".join(f"{k}={v}" for k, v in PORTABLE.items()))
