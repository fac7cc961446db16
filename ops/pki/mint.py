"""Mint a private CA, a server certificate and client (agent) certificates.

    python ops/pki/mint.py DIR [--server-name api.internal] [--server-ip 10.0.0.5]
                               [--client gpu-01 --client gpu-02] [--days 825]

Writes into DIR (created 0700; keys 0600, certificates 0644):

    ca.pem, ca.key                    the private CA (reused when DIR already has one)
    server.pem, server.key            the API's certificate: localhost, 127.0.0.1 and ::1
                                      plus every --server-name / --server-ip
    client-<name>.pem, .key           one per --client: TLS client authentication

Give the API `MODELFORGE_TLS_CERT_FILE=DIR/server.pem MODELFORGE_TLS_KEY_FILE=DIR/server.key`
(and `MODELFORGE_TLS_CLIENT_CA_FILE=DIR/ca.pem` to require client certificates), and each
agent `ca_bundle: DIR/ca.pem` (plus `client_cert`/`client_key` when required). Keep ca.key
offline once the certificates are minted. Needs the `cryptography` package (dev extra).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _save(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> None:
    _write(directory / f"{stem}.key", _key_pem(key), 0o600)
    _write(directory / f"{stem}.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)


def load_or_mint_ca(
    directory: Path, days: int
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = directory / "ca.pem", directory / "ca.key"
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise SystemExit(f"{key_path} is not an EC key minted by this script")
        return cert, key
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ModelForge private CA"),
            x509.NameAttribute(NameOID.COMMON_NAME, "ModelForge CA"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _save(directory, "ca", cert, key)
    return cert, key


def _leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    usage: x509.ObjectIdentifier,
    days: int,
    names: list[x509.GeneralName],
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def mint(
    directory: Path,
    *,
    server_names: list[str],
    server_ips: list[str],
    clients: list[str],
    days: int = 825,
) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory.chmod(0o700)
    ca_cert, ca_key = load_or_mint_ca(directory, days)
    written = [directory / "ca.pem"]
    dns = list(dict.fromkeys(["localhost", *server_names]))
    ips: list[IPAddress] = [
        ipaddress.ip_address(ip) for ip in dict.fromkeys(["127.0.0.1", "::1", *server_ips])
    ]
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns]
    names += [x509.IPAddress(ip) for ip in ips]
    cert, key = _leaf(ca_cert, ca_key, dns[-1], ExtendedKeyUsageOID.SERVER_AUTH, days, names)
    _save(directory, "server", cert, key)
    written.append(directory / "server.pem")
    for client in clients:
        if not _NAME.match(client):
            raise SystemExit(f"client name {client!r}: letters, digits, '.', '_' and '-' only")
        cert, key = _leaf(ca_cert, ca_key, client, ExtendedKeyUsageOID.CLIENT_AUTH, days, [])
        _save(directory, f"client-{client}", cert, key)
        written.append(directory / f"client-{client}.pem")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--server-name", action="append", default=[], help="DNS name; repeat")
    parser.add_argument("--server-ip", action="append", default=[], help="IP address; repeat")
    parser.add_argument("--client", action="append", default=[], help="client cert; repeat")
    parser.add_argument("--days", type=int, default=825)
    args = parser.parse_args(argv)
    written = mint(
        args.directory,
        server_names=args.server_name,
        server_ips=args.server_ip,
        clients=args.client,
        days=args.days,
    )
    for path in written:
        print(f"wrote {path} (+ {path.with_suffix('.key').name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
