#!/usr/bin/env python3
"""Demo TLS material and SuperNode key pairs for a pflower deployment.

Writes, under ``--out`` (default ``certs/``):

    ca.crt, ca.key             a self-signed demo CA (ECDSA P-384, 10 years)
    server.pem, server.key     the SuperLink's certificate, signed by the CA, with SANs for
                               localhost, 127.0.0.1, ::1, the compose service name
                               ``superlink`` and every ``--san`` given (DNS names or IPs)
    nodes/node-<i>.key         SuperNode i's private key (OpenSSH ECDSA P-384, what
                               ``flower-supernode --auth-supernode-private-key`` reads)
    nodes/node-<i>.pub         its public key (OpenSSH, what ``flwr supernode register`` reads)
    superexec.secret           a shared secret for SuperExec authentication (process isolation)

This is for demos and tests: production users bring certificates from their own CA and
generate each device's key on the device (``ssh-keygen -t ecdsa -b 384 -N "" -f node``);
only public keys ever leave a device. Private keys are written with mode 0600.

    python scripts/gen_certs.py --out certs --nodes 3
    python scripts/gen_certs.py --out certs --nodes 3 --san 10.0.0.5 --san superlink.example.org
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import secrets
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_SANS = ("localhost", "127.0.0.1", "::1", "superlink")
CURVE = ec.SECP384R1  # a NIST curve, as Flower's SuperNode authentication requires


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600 if private else 0o644)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):  # keep order, drop duplicates
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def make_ca(days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(CURVE())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pflower demo CA")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA384())
    )
    return key, cert


def make_server_cert(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, sans: list[str], days: int
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(CURVE())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, sans[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(_san(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, True, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    return key, cert


def make_node_keys() -> tuple[bytes, bytes]:
    """(OpenSSH private key, OpenSSH public key) of one SuperNode."""
    key = ec.generate_private_key(CURVE())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public + b"\n"


def generate(
    out: Path, nodes: int, sans: list[str] | tuple[str, ...] = (), days: int = 3650, force: bool = False
) -> dict[str, Path]:
    """Write the CA, the server certificate and ``nodes`` key pairs; returns the paths."""
    out = Path(out)
    if (out / "ca.crt").exists() and not force:
        raise FileExistsError(f"{out}/ca.crt exists: pass --force to replace the demo material")
    ca_key, ca_cert = make_ca(days)
    all_sans = [*DEFAULT_SANS, *sans]
    srv_key, srv_cert = make_server_cert(ca_key, ca_cert, all_sans, days)
    paths = {
        "ca": out / "ca.crt",
        "ca_key": out / "ca.key",
        "server_cert": out / "server.pem",
        "server_key": out / "server.key",
        "superexec_secret": out / "superexec.secret",
    }
    _write(paths["ca"], ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(paths["ca_key"], _pem_key(ca_key), private=True)
    _write(paths["server_cert"], srv_cert.public_bytes(serialization.Encoding.PEM))
    _write(paths["server_key"], _pem_key(srv_key), private=True)
    _write(paths["superexec_secret"], secrets.token_hex(32).encode(), private=True)
    for i in range(nodes):
        private, public = make_node_keys()
        paths[f"node-{i}.key"] = out / "nodes" / f"node-{i}.key"
        paths[f"node-{i}.pub"] = out / "nodes" / f"node-{i}.pub"
        _write(paths[f"node-{i}.key"], private, private=True)
        _write(paths[f"node-{i}.pub"], public)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="certs", help="output directory (default: certs)")
    parser.add_argument("--nodes", type=int, default=3, help="SuperNode key pairs to create (default: 3)")
    parser.add_argument(
        "--san",
        action="append",
        default=[],
        help="extra subject alternative name of the SuperLink (DNS name or IP); repeatable",
    )
    parser.add_argument("--days", type=int, default=3650, help="validity in days (default: 3650)")
    parser.add_argument("--force", action="store_true", help="replace existing material")
    args = parser.parse_args(argv)
    try:
        paths = generate(Path(args.out), args.nodes, args.san, args.days, args.force)
    except FileExistsError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"wrote {len(paths)} files to {args.out}/ (SANs: {', '.join([*DEFAULT_SANS, *args.san])})")
    print("demo material only: production users bring their own CA and generate node keys on the devices")
    return 0


if __name__ == "__main__":
    sys.exit(main())
