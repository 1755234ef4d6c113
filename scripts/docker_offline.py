#!/usr/bin/env python3
"""Build pflower's images where Docker Hub (and perhaps PyPI) cannot be reached from containers.

Two steps, each optional:

``base``
    A Debian base image with python3 and its venv module, made from the Debian mirror the host
    already uses (``debootstrap --variant=minbase``, then ``docker import``). Needs root and
    debootstrap. Build with ``--build-arg BASE=<tag>`` (compose: ``PFLOWER_BASE=<tag>``).
``wheels``
    Every wheel the image installs, downloaded by the host's pip (which may reach an index or a
    local mirror the containers cannot) into docker/buildenv/wheels/. docker/Dockerfile then
    installs from those files only. Build with ``--build-arg TORCH=<the same torch spec>``
    (compose: ``PFLOWER_TORCH=...``).

``env`` prints the ``PFLOWER_BASE``/``PFLOWER_TORCH`` lines for the two, to paste or source.

``prune`` removes the pflower images a rebuild superseded (untagged, carrying the Dockerfile's
``org.pflower.image`` label); the tagged images, and so the next build's cache, stay. Every
rebuild after a code change leaves one superseded set (about 2.2 GB with a CPU torch).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from image_requirements import requirements  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / "docker" / "buildenv" / "wheels"
SET_FILE = "requirements.txt"  # in WHEELS: what the set was downloaded for (part of the build context)
DEFAULT_TAG = "local/debian-py311:bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_TORCH = "torch torchvision"  # docker/Dockerfile's TORCH default: PyPI's wheels
IMAGE_LABEL = "org.pflower.image"  # docker/Dockerfile labels both of its stages with it
DEPS_TAG = "pflower-deps:latest"  # the tag that keeps the deps stage (the build cache) from `prune`
# A wheel built here from an sdist is byte-identical from one build to the next when its zip
# entries carry a fixed date: docker's build cache keys the COPY of docker/buildenv/ on the
# files' bytes, so a fresh wheel would rebuild the 2 GB virtual-environment layer every time.
WHEEL_BUILD_EPOCH = "315532800"  # 1980-01-01, the earliest date a zip entry can carry


class OfflineError(RuntimeError):
    """A step cannot run here; the message says what is missing and how to get it."""


def debian_mirror(
    sources: tuple[str, ...] = ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"),
) -> str:
    """The first Debian (not -security) mirror apt uses here, else deb.debian.org."""
    for name in sources:
        path = Path(name)
        if not path.is_file():
            continue
        text = path.read_text()
        urls = re.findall(r"^URIs:\s*(\S+)", text, re.M) + re.findall(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.M)
        for url in urls:
            if "security" not in url:
                return url.rstrip("/")
    return DEFAULT_MIRROR


def _need(tool: str, how: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise OfflineError(f"`{tool}` not found: {how}")
    return path


def make_base(tag: str = DEFAULT_TAG, mirror: str | None = None, suite: str = "bookworm") -> str:
    """debootstrap a minimal Debian with python3 + venv and import it as ``tag``."""
    if os.geteuid() != 0:
        raise OfflineError("debootstrap needs root: run this step with sudo")
    debootstrap = _need("debootstrap", "apt-get install debootstrap")
    docker = _need("docker", "install Docker (Debian: apt-get install docker.io) and start dockerd")
    mirror = mirror or debian_mirror()
    with tempfile.TemporaryDirectory(prefix="pflower-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        t0 = time.monotonic()
        subprocess.run(
            [
                debootstrap,
                "--variant=minbase",
                "--include=python3,python3-venv,ca-certificates",
                suite,
                str(rootfs),
                mirror,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (rootfs / junk).glob("*"):
                if p.is_file():
                    p.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(
            [docker, "import", "--change", 'CMD ["python3"]', "-", tag],
            stdin=tar.stdout,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        if tar.wait() != 0:
            raise OfflineError("tar of the debootstrapped tree failed")
    print(f"{tag}: Debian {suite} from {mirror} with python3 ({time.monotonic() - t0:.0f} s)")
    return tag


def wheel_set(torch: str) -> list[str]:
    """The requirements an image's wheel set is downloaded for: the torch spec, pflower's
    dependencies, and setuptools/wheel (the image installs pflower without build isolation)."""
    return [*torch.split(), *requirements(ROOT / "pyproject.toml"), "setuptools>=69", "wheel"]


def wheels_are_for(torch: str, dest: Path = WHEELS) -> bool:
    """Whether ``dest`` holds a complete set made by :func:`fill_wheels` for this torch spec."""
    stamp = dest / SET_FILE
    return stamp.is_file() and stamp.read_text() == "\n".join(wheel_set(torch)) + "\n"


def build_wheel(sdist: Path, dest: Path, pip: tuple[str, ...] = (sys.executable, "-m", "pip")) -> None:
    """Build ``sdist`` into a wheel in ``dest``, the same bytes every time (see WHEEL_BUILD_EPOCH)."""
    subprocess.run(
        [*pip, "wheel", "-q", "--no-deps", "--wheel-dir", str(dest), str(sdist)],
        check=True,
        env={**os.environ, "SOURCE_DATE_EPOCH": WHEEL_BUILD_EPOCH},
    )


def fill_wheels(
    torch: str = DEFAULT_TORCH, dest: Path = WHEELS, pip: tuple[str, ...] = (sys.executable, "-m", "pip")
) -> list[Path]:
    """Download the image's wheels (torch spec + pflower's dependencies + setuptools) into ``dest``.

    The host's pip settings apply (its index, mirror, find-links, CA bundle); nothing of them is
    written into ``dest``. Old wheels are removed first, so the directory is exactly one set, and
    ``requirements.txt`` there records what it is for (written last: a broken download leaves none).
    """
    dest.mkdir(parents=True, exist_ok=True)
    for old in [*dest.glob("*.whl"), dest / SET_FILE]:
        old.unlink(missing_ok=True)
    reqs = wheel_set(torch)
    # the image's python is Debian's or python:3.11-slim's: CPython 3.11 on this machine's
    # architecture, which is what the host's pip downloads for when it runs Python 3.11
    if sys.version_info[:2] != (3, 11):
        reqs_py = ["--python-version", "3.11", "--only-binary=:all:"]
    else:
        reqs_py = []
    subprocess.run([*pip, "download", "-q", "--dest", str(dest), *reqs_py, *reqs], check=True)
    for sdist in [p for p in dest.iterdir() if p.is_file() and p.suffix != ".whl"]:
        # a source-only package (hydra's antlr4 runtime): built into a wheel here, so the image
        # needs neither a build backend from an index nor a compiler
        build_wheel(sdist, dest, pip)
        sdist.unlink()
    wheels = sorted(dest.glob("*.whl"))
    (dest / SET_FILE).write_text("\n".join(reqs) + "\n")
    size = sum(p.stat().st_size for p in wheels) / 2**20
    print(f"{len(wheels)} wheels, {size:.0f} MiB in {dest}")
    return wheels


def tag_deps(base: str, torch: str, tag: str = DEPS_TAG) -> None:
    """Build (from the cache, when nothing changed) and tag docker/Dockerfile's deps stage, so
    that :func:`prune_superseded` keeps it: untagged, it would count as superseded."""
    subprocess.run(
        [
            "docker",
            "build",
            "-q",
            "-f",
            str(ROOT / "docker" / "Dockerfile"),
            "--target",
            "deps",
            "--build-arg",
            f"BASE={base}",
            "--build-arg",
            f"TORCH={torch}",
            "-t",
            tag,
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )


def prune_superseded() -> str:
    """Remove the untagged pflower images (those a rebuild replaced); returns docker's summary.
    Only images with the Dockerfile's label are touched; other projects' images stay."""
    out = subprocess.run(
        ["docker", "image", "prune", "-f", "--filter", f"label={IMAGE_LABEL}"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("base", help="debootstrap a Debian + python3 base image and docker-import it")
    b.add_argument("--tag", default=DEFAULT_TAG)
    b.add_argument("--mirror", default=None, help="Debian mirror (default: the one apt uses here)")
    b.add_argument("--suite", default="bookworm")
    w = sub.add_parser("wheels", help="download every wheel of the image into docker/buildenv/wheels")
    w.add_argument("--torch", default=DEFAULT_TORCH, help='torch requirement(s), e.g. "torch==2.13.0+cpu"')
    e = sub.add_parser("env", help="print the PFLOWER_BASE / PFLOWER_TORCH settings for compose")
    e.add_argument("--tag", default=DEFAULT_TAG)
    e.add_argument("--torch", default=DEFAULT_TORCH)
    sub.add_parser("prune", help="remove the pflower images that a rebuild superseded")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "base":
            make_base(args.tag, args.mirror, args.suite)
        elif args.cmd == "wheels":
            fill_wheels(args.torch)
        elif args.cmd == "prune":
            print(prune_superseded() or "nothing to remove")
        else:
            print(f"export PFLOWER_BASE={args.tag}\nexport PFLOWER_TORCH='{args.torch}'")
    except OfflineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as err:
        print(f"error: {' '.join(map(str, err.cmd[:3]))} ... exited with {err.returncode}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
