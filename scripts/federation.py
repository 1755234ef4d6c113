#!/usr/bin/env python3
"""Flower 1.41 connection and SuperNode registration helpers for a pflower deployment.

    # add [superlink.pflower] to $FLWR_HOME/config.toml (default ~/.flwr), TLS on
    python scripts/federation.py connection pflower --address 127.0.0.1:9093 --root-certificates certs/ca.crt

    # the same, then register SuperNode public keys (idempotent: a key already registered is fine)
    python scripts/federation.py register pflower --address 127.0.0.1:9093 \\
        --root-certificates certs/ca.crt certs/nodes/node-0.pub certs/nodes/node-1.pub

    # the explicitly named local mode: no TLS, loopback addresses only (never on a network)
    python scripts/federation.py connection local-insecure --address 127.0.0.1:9093 --local-insecure

Registration goes through the Flower CLI (`flwr supernode register <key.pub> <connection>`),
which talks to the SuperLink's Control API; this script only adds idempotency and a clear
exit status (the CLI exits 0 even when registration fails, with --format json).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomli
import tomli_w


def flwr_home() -> Path:
    return Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr").expanduser()


def _loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def write_connection(
    name: str, address: str, root_certificates: str | None = None, local_insecure: bool = False, default: bool = False
) -> Path:
    """Add or replace ``[superlink.<name>]`` in $FLWR_HOME/config.toml, keeping every other entry."""
    if local_insecure:
        if not _loopback(address):
            raise SystemExit(f"--local-insecure only connects to a loopback address, not {address!r}")
        entry: dict[str, Any] = {"address": address, "insecure": True}
    else:
        if not root_certificates:
            raise SystemExit("TLS needs --root-certificates (the CA that signed the SuperLink's certificate)")
        ca = Path(root_certificates).expanduser().resolve()
        if not ca.is_file():
            raise SystemExit(f"root certificates {ca} not found")
        entry = {"address": address, "root-certificates": str(ca)}
    path = flwr_home() / "config.toml"
    if path.exists():
        config: dict[str, Any] = tomli.loads(path.read_text())
    else:  # start from Flower's default file, so `flwr run .` alone still means the local simulation
        from flwr.cli.constant import DEFAULT_FLOWER_CONFIG_TOML

        config = tomli.loads(DEFAULT_FLOWER_CONFIG_TOML)
    links = config.setdefault("superlink", {})
    links[name] = entry
    if default or "default" not in links:
        links["default"] = name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(tomli_w.dumps(config))
    os.replace(tmp, path)
    return path


def register(name: str, public_keys: list[str], flwr: str | None = None) -> list[str]:
    """Register each public key with the SuperLink of connection ``name``; returns a line per key."""
    flwr = flwr or shutil.which("flwr") or str(Path(sys.executable).parent / "flwr")
    lines = []
    for key in public_keys:
        proc = subprocess.run(
            [flwr, "supernode", "register", key, name, "--format", "json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        try:
            result = json.loads(proc.stdout[proc.stdout.index("{") :])
        except ValueError:
            raise SystemExit(f"flwr supernode register {key}: unexpected output\n{proc.stdout}{proc.stderr}") from None
        if result.get("success"):
            lines.append(f"registered {key} as node {result.get('node-id')}")
        elif "already in use" in str(result.get("error-message", "")):
            lines.append(f"{key} was already registered")
        else:
            raise SystemExit(f"cannot register {key}: {result.get('error-message')}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd in ("connection", "register"):
        p = sub.add_parser(cmd)
        p.add_argument("name", help="connection name, used as `flwr run . <name>`")
        p.add_argument("--address", required=True, help="SuperLink address host:port")
        p.add_argument("--root-certificates", help="CA certificate (PEM) that signed the SuperLink's certificate")
        p.add_argument("--default", action="store_true", help="also make it the default connection")
        if cmd == "connection":
            p.add_argument("--local-insecure", action="store_true", help="no TLS; loopback addresses only")
        else:
            p.add_argument("public_keys", nargs="+", help="SuperNode public keys (OpenSSH ECDSA)")
    args = parser.parse_args(argv)
    path = write_connection(
        args.name, args.address, args.root_certificates, getattr(args, "local_insecure", False), args.default
    )
    print(f"connection {args.name!r} -> {args.address} in {path}")
    if args.cmd == "register":
        for line in register(args.name, args.public_keys):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
