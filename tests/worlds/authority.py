"""Certificates for the local Apache Kafka cluster, as Strimzi lays them out: a cluster CA
that signs the brokers (their advertised names as SANs), and a clients CA that signs the
users' certificates (mutual TLS). PEM files, EC P-256, made fresh for each cluster."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kafkatunnel.tunnel.tls import CA_USAGE

DAYS = 30


@dataclass(frozen=True)
class Issued:
    cert: Path  # the certificate, PEM
    key: Path  # its key, PEM (PKCS#8, unencrypted)
    chain: Path  # key and certificate in one file, as Kafka's PEM keystore takes them


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    groups = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    return x509.Name([*groups, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


class Authority:
    """A CA in `directory`: `pem` is its certificate, `issue` signs with it."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(CA_USAGE, critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.pem = directory / f"{name.replace(' ', '-')}.pem"
        self.pem.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self, stem: str, names: list[str], *, client: bool = False, groups: Sequence[str] = ()
    ) -> Issued:
        """A certificate for `names` (host names or IP literals; the first is its CN), for
        a server, or with `client` for a user; `groups` are its organizations (O), which
        Kubernetes reads as the user's groups."""
        key = ec.generate_private_key(ec.SECP256R1())
        alternatives: list[x509.GeneralName] = []
        for name in names:
            try:
                alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alternatives.append(x509.DNSName(name))
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(names[0], groups))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=DAYS))
            .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        issued = Issued(
            self.directory / f"{stem}.crt",
            self.directory / f"{stem}.key",
            self.directory / f"{stem}.pem",
        )
        issued.cert.write_bytes(cert_pem)
        issued.key.write_bytes(key_pem)
        issued.chain.write_bytes(key_pem + cert_pem)
        for path in (issued.key, issued.chain):
            path.chmod(0o600)
        return issued
