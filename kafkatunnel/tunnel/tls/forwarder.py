"""TLS to the brokers in rewrite mode: the tunnel is every broker's TLS client, so it sees
the Kafka frames inside (to rewrite, learn brokers and record), and clients keep plaintext
on loopback. The name checked is the broker's advertised host, never the forward's local
address: behind a port-forward that is 127.0.0.1, which no broker certificate names (why
kafka-proxy's users turn verification off, grepplabs/kafka-proxy#40)."""

from __future__ import annotations

import asyncio
import ssl

from kafkatunnel.tunnel.forwarders import (
    Forwarder,
    ForwarderError,
    NoAnswer,
    Upstream,
    WrappingForwarder,
    time_left,
)
from kafkatunnel.tunnel.tls.handshake import start_tls
from kafkatunnel.tunnel.tls.messages import TlsSession, verification_failure


class TlsForwarder(WrappingForwarder):
    """Any forwarder, with TLS to the broker over each stream it opens. `certificate`: the
    client certificate the context presents, as the user named it (for messages), or None."""

    def __init__(
        self,
        inner: Forwarder,
        context: ssl.SSLContext,
        certificate: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        """`timeout`: seconds a handshake may take (a stream that never answers it is
        closed then, not kept)."""
        super().__init__(inner)
        self.context = context
        self.certificate = certificate
        self.timeout = timeout
        self.sessions: dict[tuple[str, int], TlsSession] = {}  # the last one per broker

    def session(self, host: str, port: int) -> dict[str, object] | None:
        """The last TLS session with host:port, for status (None: none yet)."""
        found = self.sessions.get((host, port))
        return None if found is None else found.as_dict()

    async def open(self, host: str, port: int) -> Upstream:
        upstream = await self.inner.open(host, port)
        try:
            handshake = start_tls(upstream, self.context, host)
            tls = await asyncio.wait_for(handshake, time_left(self.timeout))
            tls.certificate_named = self.certificate
            self.sessions[(host, port)] = TlsSession.of(tls.version, tls.certificate)
            return tls
        except ssl.SSLCertVerificationError as error:
            await upstream.discard()
            certificate = await shown_certificate(self.inner, host, port)
            raise ForwarderError(verification_failure(host, port, error, certificate),
                                 permanent=True) from None  # fmt: skip
        except TimeoutError:
            await upstream.discard()
            raise NoAnswer(f"{host}:{port}: no TLS handshake within {self.timeout:g}s "
                           "(is the listener TLS?)") from None  # fmt: skip
        except BaseException:
            upstream.close()
            upstream.release()
            raise

    def describe(self, host: str, port: int) -> str:
        session = self.sessions.get((host, port))
        return f"{self.inner.describe(host, port)}, {session or 'TLS'}"


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
