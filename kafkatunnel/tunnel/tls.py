"""TLS to the brokers in rewrite mode: the tunnel is every broker's TLS client, so it sees
the Kafka frames inside (to rewrite, learn brokers and record), and clients keep plaintext
on loopback.

The handshake runs over whatever stream the forwarder gives (a kubectl port-forward, an
exec'd command's pipes, a TCP socket) with ssl.SSLObject over memory BIOs, the standard
library's sans-I/O TLS. The name checked, and sent as SNI, is the broker's advertised host,
never the forward's local address: behind a port-forward that is 127.0.0.1, which no broker
certificate names (why kafka-proxy's users turn verification off, grepplabs/kafka-proxy#40).

After the handshake a socketpair stands in for the stream: the relay reads and writes
plaintext on one end as on any upstream, and a bridge moves bytes between the other end and
the TLS stream, holding at most BRIDGE_HELD bytes each way before it stops reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import socket
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kafkatunnel.tunnel.forwarders import Forwarder, ForwarderError, TcpUpstream, Upstream
from kafkatunnel.tunnel.relay import read_some, write_all

log = logging.getLogger("kafkatunnel.tls")
READ_SIZE = 256 << 10
BRIDGE_HELD = 1 << 20  # bytes held for a slow side before the bridge stops reading the other
# OpenSSL's X509_V_ERR codes (include/openssl/x509_vfy.h) a fix is known for.
EXPIRED, NOT_YET_VALID = 10, 9
UNKNOWN_ISSUER = {2, 18, 19, 20, 21}
NAME_MISMATCH = {62, 64}  # a host name's, an IP address's


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
            f"--tls-ca {options.ca}: no PEM certificate could be read from it ({_reason(cause)}); "
            "give the CA certificate(s) the brokers' certificates are signed by, in PEM"
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
            + f": cannot use them ({_reason(cause)}); give a PEM certificate and its own "
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
                f"the certificate and key cannot be used together ({_reason(cause)})"
            ) from None


def _reason(cause: BaseException) -> str:
    reason = getattr(cause, "reason", None)
    return str(reason or cause).lower().replace("_", " ")


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
            self.sessions[(host, port)] = TlsSession.of(tls)
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


async def start_tls(upstream: Upstream, context: ssl.SSLContext, host: str) -> TlsUpstream:
    """The TLS client handshake over `upstream`, checking `host` (a name or an IP literal)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=host)
    closed = (
        f"{host} closed the connection during the TLS handshake: is this a TLS listener? "
        "(a plaintext listener needs no --tls)"
    )
    return await _handshake(upstream, tls, incoming, outgoing, closed)


async def accept_tls(client: socket.socket, context: ssl.SSLContext) -> TlsUpstream:
    """The TLS server handshake with a client that connected to a tunnel port (--client-tls)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_side=True)
    closed = (
        "the client closed the connection during the TLS handshake (does it trust the "
        "tunnel's CA? its ssl.ca.location is printed at start)"
    )
    return await _handshake(TcpUpstream(client), tls, incoming, outgoing, closed)


async def _handshake(
    upstream: Upstream,
    tls: ssl.SSLObject,
    incoming: ssl.MemoryBIO,
    outgoing: ssl.MemoryBIO,
    closed: str,
) -> TlsUpstream:
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
        await write_all(upstream.write_fd, data)
    except OSError as error:
        raise ForwarderError(await upstream.why_ended(error) or str(error)) from None


async def _receive(upstream: Upstream) -> bytes:
    try:
        return await read_some(upstream.read_fd, READ_SIZE)
    except OSError as error:
        raise ForwarderError(await upstream.why_ended(error) or str(error)) from None


# -- the bridge --------------------------------------------------------------------------------


class TlsUpstream(Upstream):
    """Plaintext on a socketpair for the relay; TLS records on the forwarder's stream."""

    def __init__(
        self, inner: Upstream, tls: ssl.SSLObject, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO
    ) -> None:
        self.inner = inner
        self.tls = tls
        self.version = tls.version() or "TLS"
        self.certificate = tls.getpeercert(binary_form=True)
        self._incoming, self._outgoing = incoming, outgoing
        self._loop = asyncio.get_running_loop()
        ours, self._plain = socket.socketpair()
        ours.setblocking(False)
        self._plain.setblocking(False)
        self._ours = ours
        self.read_fd = self.write_fd = ours.fileno()
        self._to_plain = bytearray()  # decrypted, not yet written to the relay's end
        self._to_broker = bytearray()  # encrypted, not yet written to the forwarder
        self._broker_ended = self._plain_ended = False
        self._failure: str | None = None
        self._watching: set[tuple[int, bool]] = set()
        self._released = False
        inner.on_gone = self._inner_gone
        self._watch(inner.read_fd, False, self._from_broker)
        self._watch(self._plain.fileno(), False, self._from_plain)
        if incoming.pending:  # data that came with the handshake's last flight (TLS 1.3)
            self._loop.call_soon(self._decrypt)

    # -- Upstream ------------------------------------------------------------------------------

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._ours.shutdown(socket.SHUT_RDWR)
        self.inner.close()

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        for fd, writing in list(self._watching):
            self._unwatch(fd, writing)
        self._ours.close()
        self._plain.close()
        self.inner.release()

    async def wait_closed(self) -> None:
        await self.inner.wait_closed()

    async def why_ended(self, error: OSError | None) -> str | None:
        if self._failure is not None:
            return self._failure
        return await self.inner.why_ended(None)

    def _inner_gone(self) -> None:
        if self.on_gone is not None:
            self.on_gone()

    # -- moving bytes --------------------------------------------------------------------------

    def _from_broker(self) -> None:
        try:
            data = os.read(self.inner.read_fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            self._fail(f"connection to the broker lost: {error.strerror}")
            return
        if not data:
            self._incoming.write_eof()
        else:
            self._incoming.write(data)
        self._decrypt()
        if not data:
            self._end_from_broker()

    def _decrypt(self) -> None:
        if self._released:
            return
        while True:
            try:
                chunk = self.tls.read(READ_SIZE)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # the broker's close_notify
                self._end_from_broker()
                break
            except ssl.SSLError as error:
                if not self._incoming.eof:
                    self._fail(alert_message(_reason(error)))
                    self.refused = True  # the broker said no to this client: retrying won't help
                break
            if not chunk:  # SSLObject's word for the broker's close_notify
                self._end_from_broker()
                break
            self._to_plain += chunk
        self._flush_broker()  # a TLS 1.3 KeyUpdate asks for an answer
        self._flush_plain()

    def _end_from_broker(self) -> None:
        if self._broker_ended:
            return
        self._broker_ended = True
        self._unwatch(self.inner.read_fd, False)
        self._flush_plain()

    def _from_plain(self) -> None:
        try:
            data = self._plain.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._plain_ended = True
            self._unwatch(self._plain.fileno(), False)
            with contextlib.suppress(ssl.SSLError):
                self.tls.unwrap()  # close_notify: the broker sees a clean end
            self._to_broker += self._outgoing.read()
            self._flush_broker()
            return
        try:
            self.tls.write(data)
        except ssl.SSLError as error:
            self._fail(f"TLS error towards the broker: {_reason(error)}")
            return
        self._to_broker += self._outgoing.read()
        self._flush_broker()

    def _flush_plain(self) -> None:
        fd = self._plain.fileno()
        while self._to_plain:
            try:
                sent = self._plain.send(self._to_plain)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # the relay's end is closed: nobody wants these bytes
                self._to_plain.clear()
                break
            del self._to_plain[:sent]
        self._backpressure(self._to_plain, fd, self.inner.read_fd, self._from_broker,
                           self._flush_plain, self._broker_ended)  # fmt: skip
        if not self._to_plain and self._broker_ended:
            with contextlib.suppress(OSError):
                self._plain.shutdown(socket.SHUT_WR)

    def _flush_broker(self) -> None:
        if self._outgoing.pending:
            self._to_broker += self._outgoing.read()
        fd = self.inner.write_fd
        while self._to_broker:
            try:
                written = os.write(fd, self._to_broker)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as error:
                self._fail(f"connection to the broker lost: {error.strerror}")
                return
            del self._to_broker[:written]
        self._backpressure(self._to_broker, fd, self._plain.fileno(), self._from_plain,
                           self._flush_broker, self._plain_ended)  # fmt: skip

    def _backpressure(
        self,
        held: bytearray,
        sink: int,
        source: int,
        on_source: Callable[[], None],
        on_sink: Callable[[], None],
        source_ended: bool,
    ) -> None:
        """Wait for room in `sink` while bytes are held for it; stop reading `source`
        while more than BRIDGE_HELD are."""
        if held:
            self._watch(sink, True, on_sink)
        else:
            self._unwatch(sink, True)
        if source_ended:
            return
        if len(held) > BRIDGE_HELD:
            self._unwatch(source, False)
        else:
            self._watch(source, False, on_source)

    def _fail(self, reason: str) -> None:
        """The stream is broken: the relay sees its end, and why_ended says why."""
        if self._failure is None:
            self._failure = reason
        self._to_plain.clear()
        self._broker_ended = self._plain_ended = True
        for fd, writing in list(self._watching):
            self._unwatch(fd, writing)
        with contextlib.suppress(OSError):
            self._plain.shutdown(socket.SHUT_RDWR)

    def _watch(self, fd: int, writing: bool, callback: Callable[[], None]) -> None:
        if self._released or (fd, writing) in self._watching:
            return
        self._watching.add((fd, writing))
        if writing:
            self._loop.add_writer(fd, callback)
        else:
            self._loop.add_reader(fd, callback)

    def _unwatch(self, fd: int, writing: bool) -> None:
        if (fd, writing) not in self._watching:
            return
        self._watching.discard((fd, writing))
        if writing:
            self._loop.remove_writer(fd)
        else:
            self._loop.remove_reader(fd)


# -- saying what went wrong --------------------------------------------------------------------

# TLS alerts a broker sends about the client (RFC 8446 6.2), and what to do about them.
ALERT_FIXES = {
    "certificate required": "the broker requires a client certificate (mTLS): give "
    "--tls-cert FILE and --tls-key FILE",
    "unknown ca": "the broker does not trust the CA of --tls-cert: use a certificate "
    "signed by a CA it trusts (for Strimzi, the clients CA)",
    "bad certificate": "the broker refused the certificate of --tls-cert: check that it is "
    "a client certificate (extended key usage clientAuth) from a CA the broker trusts",
    "certificate expired": "the certificate of --tls-cert has expired: renew it",
    "certificate revoked": "the certificate of --tls-cert was revoked: get a new one",
    "access denied": "the broker refused this client's identity (its ACLs or principal)",
}


def alert_message(reason: str) -> str:
    """The broker ended TLS with `reason` (OpenSSL's words): what it means and the fix."""
    for words, fix in ALERT_FIXES.items():
        if words in reason:
            return f"TLS: the broker refused this client ({reason}); fix: {fix}"
    return f"TLS error from the broker: {reason}"


def verification_failure(
    host: str, port: int, error: ssl.SSLCertVerificationError, certificate: bytes | None
) -> str:
    """Why the broker at host:port was not trusted, what its certificate says, and the fix."""
    code = error.verify_code
    what = error.verify_message or _reason(error)
    shown = describe_certificate(certificate) if certificate else None
    lines = [f"TLS: the certificate of {host}:{port} was refused: {what} (name checked: {host})"]
    if shown is not None:
        lines.append(
            f"  its certificate: subject {shown.subject}; "
            f"names {', '.join(shown.names) or 'none'}; issuer {shown.issuer}; "
            f"valid until {shown.not_after:%Y-%m-%d %H:%M} UTC"
        )
    if code in NAME_MISMATCH:
        fix = (
            f"the certificate does not name {host}, the address the cluster advertises: the "
            "broker needs a certificate whose SANs include it (a listener's advertised name)"
        )
    elif code in (EXPIRED, NOT_YET_VALID):
        fix = "the certificate is outside its validity period: renew it (or check this clock)"
    elif code in UNKNOWN_ISSUER:
        fix = "trust the CA that signed it: --tls-ca FILE (its PEM; several may be in one file)"
    else:
        fix = "check the broker's certificate and the CA given with --tls-ca"
    lines.append(f"  fix: {fix}; --tls-insecure turns all checks off, for test clusters only")
    return "\n".join(lines)


@dataclass(frozen=True)
class TlsSession:
    """What a broker's TLS session was: its version and the certificate it showed."""

    version: str
    certificate: CertificateFacts | None

    @classmethod
    def of(cls, tls: TlsUpstream) -> TlsSession:
        shown = describe_certificate(tls.certificate) if tls.certificate else None
        return cls(tls.version, shown)

    def as_dict(self) -> dict[str, object]:
        shown = self.certificate
        return {
            "version": self.version,
            "subject": None if shown is None else shown.subject,
            "names": [] if shown is None else shown.names,
            "issuer": None if shown is None else shown.issuer,
            "expires": None if shown is None else shown.not_after.isoformat(),
        }

    def __str__(self) -> str:
        if self.certificate is None:
            return self.version
        return (
            f"{self.version} {self.certificate.subject} until {self.certificate.not_after:%Y-%m-%d}"
        )


@dataclass(frozen=True)
class CertificateFacts:
    subject: str
    names: list[str]  # the subject alternative names, as DNS:... and IP:...
    issuer: str
    not_after: datetime.datetime


def describe_certificate(der: bytes) -> CertificateFacts | None:
    """What a DER certificate says about itself (None: it cannot be read)."""
    from cryptography import x509

    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError:
        return None
    names: list[str] = []
    with contextlib.suppress(x509.ExtensionNotFound):
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names += [f"DNS:{n}" for n in san.get_values_for_type(x509.DNSName)]
        names += [f"IP:{a}" for a in san.get_values_for_type(x509.IPAddress)]
    return CertificateFacts(
        cert.subject.rfc4514_string() or "(empty)",
        names,
        cert.issuer.rfc4514_string() or "(empty)",
        cert.not_valid_after_utc,
    )
