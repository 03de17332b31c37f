"""A test certificate authority made with `cryptography`: a CA, and server and client
certificates it signs, with whatever names, validity and issuer a test needs."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kafkatunnel.tunnel.tls import CA_USAGE

NOW = datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class Issued:
    cert: Path  # PEM certificate
    key: Path  # PEM private key (unencrypted unless issued with a password)
    p12: Path  # both in PKCS#12, encrypted with the password (if issued with one)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path, password: bytes | None) -> None:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )


class TestAuthority:
    __test__ = False  # a helper, not tests
    """A CA whose certificate is `self.pem`; `issue` signs certificates with it."""

    def __init__(self, directory: Path, name: str = "kafkatunnel test CA") -> None:
        self.directory = directory
        self.name = name
        self.key = ec.generate_private_key(ec.SECP256R1())
        slug = name.replace(" ", "-")
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - datetime.timedelta(days=1))
            .not_valid_after(NOW + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(CA_USAGE, critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        self.pem = directory / f"{slug}.pem"
        self.pem.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        file_stem: str,
        names: list[str],
        *,
        client: bool = False,
        not_after: datetime.datetime | None = None,
        password: bytes | None = None,
    ) -> Issued:
        """A certificate for `names` (DNS names or IP literals; the first is the CN)."""
        key = ec.generate_private_key(ec.SECP256R1())
        alternatives: list[x509.GeneralName] = []
        for name in names:
            try:
                alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alternatives.append(x509.DNSName(name))
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        end = not_after or NOW + datetime.timedelta(days=30)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(names[0]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(min(end, NOW) - datetime.timedelta(days=2))
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        stem = self.directory / file_stem
        issued = Issued(
            stem.with_suffix(".pem"), stem.with_suffix(".key"), stem.with_suffix(".p12")
        )
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, issued.key, password)
        issued.p12.write_bytes(
            pkcs12.serialize_key_and_certificates(
                file_stem.encode(), key, cert, [self.cert],
                serialization.BestAvailableEncryption(password)
                if password
                else serialization.NoEncryption(),
            )
        )  # fmt: skip
        return issued
