"""TLS to the brokers in rewrite mode: the tunnel is every broker's TLS client, so it sees
the Kafka frames inside (to rewrite, learn brokers and record), and clients keep plaintext
on loopback.

The handshake runs over whatever stream the forwarder gives: on a socket (a direct
connection, a kubectl port-forward's local port) OpenSSL reads and writes the socket itself
(tls_socket.py); on an exec'd command's pipes ssl.SSLObject runs over memory BIOs, the
standard library's sans-I/O TLS (tls_stream.py). The name checked, and sent as SNI, is the
broker's advertised host, never the forward's local address: behind a port-forward that
is 127.0.0.1, which no broker certificate names (why kafka-proxy's users turn verification
off, grepplabs/kafka-proxy#40).

What went wrong is said by certificates.py.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kafkatunnel.tunnel.certificates import TlsSession, openssl_reason, verification_failure
from kafkatunnel.tunnel.forwarders import Forwarder, ForwarderError, TcpUpstream, Upstream
from kafkatunnel.tunnel.tls_socket import SocketTlsUpstream, handshake
from kafkatunnel.tunnel.tls_stream import READ_SIZE, TlsUpstream

TlsStream = SocketTlsUpstream | TlsUpstream  # over a socket; over any other stream


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


def pkcs12_pem(path: Path, password: bytes | None) -> tuple[bytes, bytes]:
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
    return pem, key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


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


# -- the handshake -----------------------------------------------------------------------------


class TlsForwarder(Forwarder):
    """Any forwarder, with TLS to the broker over each stream it opens."""

    def __init__(self, inner: Forwarder, context: ssl.SSLContext) -> None:
        self.inner = inner
        self.context = context
        self.kind = inner.kind
        self.sessions: dict[tuple[str, int], TlsSession] = {}  # the last one per broker

    def session(self, host: str, port: int) -> dict[str, object] | None:
        """The last TLS session with host:port, for status (None: none yet)."""
        found = self.sessions.get((host, port))
        return None if found is None else found.as_dict()

    async def open(self, host: str, port: int) -> Upstream:
        upstream = await self.inner.open(host, port)
        try:
            tls = await start_tls(upstream, self.context, host)
            self.sessions[(host, port)] = TlsSession.of(tls.version, tls.certificate)
            return tls
        except ssl.SSLCertVerificationError as error:
            await upstream.discard()
            certificate = await shown_certificate(self.inner, host, port)
            raise ForwarderError(verification_failure(host, port, error, certificate),
                                 permanent=True) from None  # fmt: skip
        except BaseException:
            upstream.close()
            upstream.release()
            raise

    def describe(self, host: str, port: int) -> str:
        session = self.sessions.get((host, port))
        return f"{self.inner.describe(host, port)}, {session or 'TLS'}"

    def restarts(self, host: str, port: int) -> int:
        return self.inner.restarts(host, port)

    def replacements(self, host: str, port: int) -> int:
        return self.inner.replacements(host, port)

    def suspect(self, host: str, port: int, signal: str) -> None:
        self.inner.suspect(host, port, signal)

    def expect(self, host: str, port: int) -> None:
        self.inner.expect(host, port)

    async def prepare(self) -> None:
        await self.inner.prepare()

    async def close(self) -> None:
        await self.inner.close()


async def speaks_tls(forwarder: Forwarder, host: str, port: int) -> bool:
    """Whether host:port completes a TLS handshake (asked after it hung up on plaintext)."""
    return await shown_certificate(forwarder, host, port) is not None


async def shown_certificate(
    forwarder: Forwarder, host: str, port: int, timeout: float = 5.0
) -> bytes | None:
    """The certificate (DER) host:port shows in a TLS handshake that verifies nothing, for
    messages only (None: no TLS handshake completed; b"": no certificate shown)."""
    looking = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    looking.check_hostname = False
    looking.verify_mode = ssl.CERT_NONE
    try:
        upstream = await asyncio.wait_for(forwarder.open(host, port), timeout)
    except (ForwarderError, OSError, TimeoutError):
        return None
    try:
        tls = await asyncio.wait_for(start_tls(upstream, looking, host), timeout)
    except (ssl.SSLError, OSError, TimeoutError, ForwarderError):
        await upstream.discard()
        return None
    await tls.discard()
    return tls.certificate or b""


async def start_tls(upstream: Upstream, context: ssl.SSLContext, host: str) -> TlsStream:
    """The TLS client handshake over `upstream`, checking `host` (a name or an IP literal)."""
    closed = (
        f"{host} closed the connection during the TLS handshake: is this a TLS listener? "
        "(a plaintext listener needs no --tls)"
    )
    if isinstance(upstream, TcpUpstream):
        return await handshake(upstream, context, closed, server_hostname=host)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=host)
    return await _handshake(upstream, tls, incoming, outgoing, closed)


async def accept_tls(client: socket.socket, context: ssl.SSLContext) -> SocketTlsUpstream:
    """The TLS server handshake with a client that connected to a tunnel port (--client-tls)."""
    closed = (
        "the client closed the connection during the TLS handshake (does it trust the "
        "tunnel's CA? its ssl.ca.location is printed at start)"
    )
    return await handshake(TcpUpstream(client), context, closed)


async def _handshake(
    upstream: Upstream,
    tls: ssl.SSLObject,
    incoming: ssl.MemoryBIO,
    outgoing: ssl.MemoryBIO,
    closed: str,
) -> TlsUpstream:
    """The handshake over a stream that is not a socket, through memory BIOs."""
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            pass
        if outgoing.pending:
            await _send(upstream, outgoing.read())
        data = await _receive(upstream)
        if not data:
            raise ForwarderError(await upstream.why_ended(None) or closed)
        incoming.write(data)
    if outgoing.pending:  # the last flight (a client's Finished in TLS 1.2, a server's tickets)
        await _send(upstream, outgoing.read())
    return TlsUpstream(upstream, tls, incoming, outgoing)


async def _send(upstream: Upstream, data: bytes) -> None:
    try:
        await upstream.send(data)
    except OSError as error:
        raise ForwarderError(await upstream.why_ended(error) or str(error)) from None


async def _receive(upstream: Upstream) -> bytes:
    try:
        return await upstream.receive(READ_SIZE)
    except OSError as error:
        raise ForwarderError(await upstream.why_ended(error) or str(error)) from None
