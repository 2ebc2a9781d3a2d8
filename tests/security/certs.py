"""Certificates for the security tests, made with `cryptography`: a CA, a server
certificate for 127.0.0.1 and localhost, a client certificate, an expired one."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CLIENT_SUBJECT = "CN=alice,OU=eng,O=bucketlog test,C=FR"


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    expired_cert: Path
    expired_key: Path


def _name(*parts: tuple[x509.ObjectIdentifier, str]) -> x509.Name:
    return x509.Name([x509.NameAttribute(oid, value) for oid, value in parts])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _issue(
    subject: x509.Name,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    key: ec.EllipticCurvePrivateKey,
    not_before: datetime.datetime,
    not_after: datetime.datetime,
    *,
    ca: bool = False,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_certificates(folder: Path) -> Certificates:
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    day = datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name((NameOID.COMMON_NAME, "bucketlog test CA"))
    ca = _issue(ca_name, ca_name, ca_key, ca_key, now - day, now + 30 * day, ca=True)
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    def leaf(stem: str, subject: x509.Name, before, after, sans=None) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(subject, ca_name, ca_key, key, before, after, sans=sans)
        cert_path, key_path = folder / f"{stem}.pem", folder / f"{stem}-key.pem"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key_path, key)
        return cert_path, key_path

    server = leaf(
        "server",
        _name((NameOID.COMMON_NAME, "localhost")),
        now - day,
        now + 30 * day,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_name = _name(
        (NameOID.COUNTRY_NAME, "FR"),
        (NameOID.ORGANIZATION_NAME, "bucketlog test"),
        (NameOID.ORGANIZATIONAL_UNIT_NAME, "eng"),
        (NameOID.COMMON_NAME, "alice"),
    )
    client = leaf("client", client_name, now - day, now + 30 * day)
    expired = leaf(
        "expired", _name((NameOID.COMMON_NAME, "mallory")), now - 30 * day, now - 2 * day
    )
    return Certificates(folder / "ca.pem", *server, *client, *expired)
