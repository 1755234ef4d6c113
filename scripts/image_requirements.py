#!/usr/bin/env python3
"""pflower's dependencies for a container image, torch and torchvision left out.

docker/Dockerfile installs these next to its ``TORCH`` build argument (the torch build is the
image's choice: PyPI's CUDA-bundling wheels by default, a CPU wheel for a small offline image),
and ``scripts/docker_offline.py wheels`` downloads the same list for a build without an index.
Standard library only: the Dockerfile runs it before anything is installed.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

TORCH_PACKAGES = ("torch", "torchvision")


def requirements(pyproject: str | Path) -> list[str]:
    deps = tomllib.loads(Path(pyproject).read_text())["project"]["dependencies"]
    return [d for d in deps if re.split(r"[^A-Za-z0-9_.-]", d.strip(), maxsplit=1)[0].lower() not in TORCH_PACKAGES]


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "pyproject.toml"
    print("\n".join(requirements(path)))
