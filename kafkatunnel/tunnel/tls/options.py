"""How the tunnel talks TLS to the brokers: the options `up --tls...` gives, and the one
SSLContext made of them (TLS 1.2 or newer, the broker's name checked), with errors that
name the flag at fault."""

from __future__ import annotations

import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from kafkatunnel.tunnel.tls.messages import openssl_reason


@dataclass(frozen=True)
class TlsOptions:
    """How the tunnel talks TLS to the brokers (`up --tls ...`)."""

    ca: Path | None = None  # PEM bundle of the CAs to trust (None: the system's)
    cert: Path | None = None  # client certificate (mTLS), PEM, maybe with its key
    key: Path | None = None  # its private key, PEM
    password: bytes | None = None  # of an encrypted key: from a file or variable, never a flag
    insecure: bool = False  # no verification at all: broken test clusters only
    # The same, read from the cluster (Strimzi's secrets) rather than from files: PEM.
    ca_pem: bytes | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    cert_pem_from: str | None = None  # where cert_pem came from: --tls-pkcs12 FILE, ...

    @property
    def certificate_named(self) -> str | None:
        """The client certificate presented, as the user named it (None: none), for the
        messages about it."""
        if self.cert is not None:
            return f"--tls-cert {self.cert}"
        if self.cert_pem is not None:
            return self.cert_pem_from or "the client certificate"
        return None

    def warnings(self) -> list[str]:
        """What the user must hear on every start."""
        if not self.insecure:
            return []
        return [
            "--tls-insecure: broker certificates are NOT verified (neither issuer nor name): "
            "anyone on the path can read and change this traffic; use --tls-ca FILE instead"
        ]


class TlsSetupError(ValueError):
    """A TLS option cannot be used; the message names the flag and the fix."""


def client_context(options: TlsOptions) -> ssl.SSLContext:
    """The SSLContext for every broker connection (TLS 1.2 or newer, names checked)."""
    try:
        context = ssl.create_default_context(
            cafile=options.ca, cadata=None if options.ca_pem is None else options.ca_pem.decode()
        )
    except FileNotFoundError:
        raise TlsSetupError(f"--tls-ca {options.ca}: no such file") from None
    except (ssl.SSLError, OSError) as cause:
        raise TlsSetupError(
            f"--tls-ca {options.ca}: no PEM certificate could be read from it "
            f"({openssl_reason(cause)}); give the CA certificate(s) the brokers' certificates "
            "are signed by, in PEM"
        ) from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if options.key is not None and options.cert is None:
        raise TlsSetupError("--tls-key needs --tls-cert (the certificate of that key)")
    if options.cert is not None:
        _load_client_certificate(context, options)
    elif options.cert_pem is not None and options.key_pem is not None:
        load_pem_chain(context, options.cert_pem, options.key_pem)
    if options.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _load_client_certificate(context: ssl.SSLContext, options: TlsOptions) -> None:
    def password() -> bytes:
        if options.password is None:
            raise TlsSetupError(
                f"--tls-key {options.key or options.cert}: the key is encrypted; put its "
                "password in a file given by --tls-password-file, or in "
                "KAFKATUNNEL_TLS_PASSWORD"
            )
        return options.password

    for flag, path in (("--tls-cert", options.cert), ("--tls-key", options.key)):
        if path is not None and not Path(path).is_file():
            raise TlsSetupError(f"{flag} {path}: no such file")
    try:
        context.load_cert_chain(options.cert, options.key, password=password)  # type: ignore[arg-type]
    except ssl.SSLError as cause:
        raise TlsSetupError(
            f"--tls-cert {options.cert}"
            + (f" --tls-key {options.key}" if options.key else "")
            + f": cannot use them ({openssl_reason(cause)}); give a PEM certificate and its own "
            "PEM private key (a wrong password reads as a bad key)"
        ) from None


class PemPair(NamedTuple):
    """A certificate (with any chain after it) and its private key, as PEM."""

    cert: bytes
    key: bytes


def pkcs12_pem(path: Path, password: bytes | None) -> PemPair:
    """The certificate (with any chain after it) and key of a PKCS#12 file, as PEM: what
    Strimzi's user.p12 and Java keystores hold, and OpenSSL cannot load as they are."""
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        pkcs12,
    )

    try:
        data = Path(path).read_bytes()
    except OSError as cause:
        raise TlsSetupError(f"--tls-pkcs12 {path}: {cause.strerror or cause}") from None
    try:
        key, cert, chain = pkcs12.load_key_and_certificates(data, password)
    except ValueError:
        hint = "no password was given" if password is None else "the password is wrong"
        raise TlsSetupError(
            f"--tls-pkcs12 {path}: cannot be opened ({hint}, or it is not PKCS#12); put "
            "its password in a file given by --tls-password-file, or in "
            "KAFKATUNNEL_TLS_PASSWORD"
        ) from None
    if key is None or cert is None:
        raise TlsSetupError(f"--tls-pkcs12 {path}: holds no certificate with its private key")
    pem = cert.public_bytes(Encoding.PEM) + b"".join(c.public_bytes(Encoding.PEM) for c in chain)
    return PemPair(pem, key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))


def load_pem_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """Load a certificate and key held in memory: OpenSSL reads them from files, so they
    pass through a directory of the user's own (0700, files 0600), gone right after."""
    with tempfile.TemporaryDirectory(prefix="kafkatunnel-tls-") as directory:
        cert_path, key_path = Path(directory, "user.crt"), Path(directory, "user.key")
        for path, data in ((cert_path, cert), (key_path, key)):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as out:
                out.write(data)
        try:
            context.load_cert_chain(cert_path, key_path)
        except ssl.SSLError as cause:
            raise TlsSetupError(
                f"the certificate and key cannot be used together ({openssl_reason(cause)})"
            ) from None
