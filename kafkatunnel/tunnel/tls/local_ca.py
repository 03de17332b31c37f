"""TLS between clients and the tunnel (`up --client-tls`), for clients whose configuration
says `security.protocol=SSL` and should keep saying it.

The tunnel makes a CA of its own once, in its state directory (`client-ca/`, 0700; the key
0600), and at each start a certificate for the addresses clients connect to, signed by it.
Clients trust that CA (`ssl.ca.location`, printed at start) and nothing else changes for
them. Why a CA and not a self-signed certificate: the certificate changes with the listen
address, the CA file clients point at does not."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kafkatunnel.files import create_private, state_dir, state_directory, write_whole
from kafkatunnel.tunnel.tls.options import PemPair, load_pem_chain

CA_NAME = "kafkatunnel local CA"
CA_DAYS = 3650
LEAF_DAYS = 90
CA_USAGE = x509.KeyUsage(
    digital_signature=True, content_commitment=False, key_encipherment=False,
    data_encipherment=False, key_agreement=False, key_cert_sign=True,
    crl_sign=True, encipher_only=False, decipher_only=False,
)  # fmt: skip


@dataclass(frozen=True)
class ClientTls:
    context: ssl.SSLContext  # the listeners' server side
    ca: Path  # what clients trust: ssl.ca.location


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


class LocalCa(NamedTuple):
    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    path: Path  # of the certificate, PEM: what clients trust


def local_ca(directory: Path) -> LocalCa:
    """The tunnel's own CA in `directory`, made the first time."""
    state_directory(directory)
    cert_path, key_path = directory / "ca.pem", directory / "ca.key"
    if cert_path.exists() and key_path.exists():
        key = serialization.load_pem_private_key(key_path.read_bytes(), None)
        if isinstance(key, ec.EllipticCurvePrivateKey):
            return LocalCa(x509.load_pem_x509_certificate(cert_path.read_bytes()), key, cert_path)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(CA_NAME))
        .issuer_name(_name(CA_NAME))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(CA_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    key_path.unlink(missing_ok=True)
    with open(create_private(key_path), "wb") as out:
        out.write(key_pem)
    write_whole(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return LocalCa(cert, key, cert_path)


def server_certificate(ca: LocalCa, names: list[str]) -> PemPair:
    """A certificate for the addresses and names clients connect to."""
    key = ec.generate_private_key(ec.SECP256R1())
    alternatives: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternatives.append(x509.DNSName(name))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"kafkatunnel {names[0]}"))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
        .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), False
        )
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return PemPair(cert.public_bytes(serialization.Encoding.PEM), key_pem)


def listener_tls(
    listen_host: str, directory: Path | None = None, told: tuple[str, ...] = ()
) -> ClientTls:
    """The listeners' TLS: a certificate from the tunnel's CA, made now, for `listen_host`,
    loopback's names and every host clients are `told` (--advertise, a Docker bridge's
    address, host.docker.internal): a client verifies the name it was told."""
    ca = local_ca(directory or state_dir() / "client-ca")
    names = [listen_host, *told, "127.0.0.1", "::1", "localhost"]
    cert, key = server_certificate(ca, names)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    load_pem_chain(context, cert, key)
    return ClientTls(context, ca.path)
