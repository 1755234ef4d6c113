"""``pflower superlink status|stop``: the local SuperLink that `flwr run .` starts, and only yours.

`flwr run .` starts a detached ``flower-superlink`` (HTTP API on ``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT``,
default 39091; Control API on ``FLWR_LOCAL_CONTROL_API_PORT``, default 39093; state and log under
``$FLWR_HOME/local-superlink``) that outlives the command and keeps the working directory and
Python environment it was started from: a relative ``output_dir`` lands there. These commands find
the SuperLink of this shell's ``FLWR_HOME`` and ports, owned by this user, so other users' and
other clones' SuperLinks are never touched (unlike ``pkill -f flower-superlink``).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LocalSuperLink:
    pid: int
    http_port: str
    control_port: str
    flwr_home: Path | None
    cwd: Path | None


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None


def local_superlinks() -> list[LocalSuperLink]:
    """Every local SuperLink (the simulation-mode ``flower-superlink`` that `flwr run` starts) of this user."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.parent.stat().st_uid != os.getuid():
                continue
            args = [a.decode(errors="replace") for a in cmdline.read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if not args or not any(Path(a).name == "flower-superlink" for a in args[:2]) or "--simulation" not in args:
            continue
        control = _arg(args, "--control-api-address") or ""
        log_file = _arg(args, "--log-file")
        try:
            cwd: Path | None = (cmdline.parent / "cwd").resolve(strict=True)
        except OSError:
            cwd = None
        found.append(
            LocalSuperLink(
                pid=int(cmdline.parent.name),
                http_port=_arg(args, "--port") or "?",
                control_port=control.rsplit(":", 1)[-1],
                flwr_home=Path(log_file).parent.parent if log_file else None,
                cwd=cwd,
            )
        )
    return sorted(found, key=lambda s: s.pid)


def flwr_home() -> Path:
    return Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr").expanduser().resolve()


def control_port() -> str:
    return os.environ.get("FLWR_LOCAL_CONTROL_API_PORT", "39093")


def mine(superlinks: list[LocalSuperLink], home: Path | None = None, port: str | None = None) -> list[LocalSuperLink]:
    """The SuperLinks of this ``FLWR_HOME`` and Control API port (the one `flwr run .` here would use)."""
    home, port = home or flwr_home(), port or control_port()
    return [s for s in superlinks if s.control_port == port and (s.flwr_home is None or s.flwr_home.resolve() == home)]


def stop(superlink: LocalSuperLink, wait_s: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after ``wait_s``; True when the process is gone."""
    try:
        os.kill(superlink.pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not Path(f"/proc/{superlink.pid}").exists() or _zombie(superlink.pid):
                return True
            time.sleep(0.2)
        os.kill(superlink.pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return True
    except PermissionError:
        return False


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


def describe(s: LocalSuperLink) -> str:
    return (
        f"pid {s.pid}: HTTP API 127.0.0.1:{s.http_port}, Control API 127.0.0.1:{s.control_port}, "
        f"FLWR_HOME {s.flwr_home or '?'}, working directory {s.cwd or '?'} (a relative output_dir lands there)"
    )


USAGE = """usage: pflower superlink status|stop
  status  the local SuperLink `flwr run .` uses from this shell (this FLWR_HOME and
          FLWR_LOCAL_CONTROL_API_PORT), with its working directory; and your others
  stop    stop that one only (the next `flwr run .` starts a fresh one from here)"""


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("status", "stop"):
        print(USAGE)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    every = local_superlinks()
    ours = mine(every)
    where = f"FLWR_HOME {flwr_home()}, Control API port {control_port()}"
    if argv[0] == "status":
        if not ours:
            print(f"no local SuperLink for {where}: `flwr run .` will start one from its working directory")
        for s in ours:
            print(f"local SuperLink for {where}:\n  {describe(s)}")
        others = [s for s in every if s not in ours]
        if others:
            print("your other local SuperLinks (other FLWR_HOME or ports):")
            for s in others:
                print(f"  {describe(s)}")
        return 0
    if not ours:
        print(f"no local SuperLink for {where}: nothing to stop")
        return 0
    failed = [s for s in ours if not stop(s)]
    for s in ours:
        print(f"{'could not stop' if s in failed else 'stopped'} the local SuperLink {describe(s)}")
    return 1 if failed else 0
