"""TLS handshakes over the streams forwarders open, and the upstream they leave: a client's
handshake with a broker (the name checked, and sent as SNI, is the broker's advertised
host, never the forward's local address), or a server's with a client of --client-tls.

On a socket OpenSSL runs the handshake on the socket itself; on any other stream (an exec'd
command's pipes) ssl.SSLObject runs it over memory BIOs. Either way the TlsUpstream that
results hands the relay a TLS byte stream (streams.py) and keeps the inner upstream's
bookkeeping (closing, releasing, a kubectl forward's), and says why it ended in words a
user can act on.
"""

from __future__ import annotations

import socket
import ssl

from kafkatunnel.tunnel.forwarders import ForwarderError, TcpUpstream, Upstream
from kafkatunnel.tunnel.streams import READ_SIZE, wait_ready
from kafkatunnel.tunnel.tls.messages import alert_message, openssl_reason
from kafkatunnel.tunnel.tls.streams import BioTlsStream, SocketTlsStream


class TlsUpstream(Upstream):
    """An established TLS session over `inner`; the relay reads and writes `stream`."""

    # The client certificate presented, as the user named it (--tls-cert FILE); None: none.
    # What a broker's alert about it is said to be about.
    certificate_named: str | None = None

    def __init__(
        self,
        inner: Upstream,
        stream: SocketTlsStream | BioTlsStream,
        session: ssl.SSLSocket | ssl.SSLObject,
    ) -> None:
        self.inner = inner
        self._stream = self.tls_stream = stream
        self.version = session.version() or "TLS"
        self.certificate = session.getpeercert(binary_form=True)
        self.read_fd, self.write_fd = stream.read_fd, stream.write_fd
        self._released = False
        inner.on_gone = self._inner_gone

    def _inner_gone(self) -> None:
        if self.on_gone is not None:
            self.on_gone()

    def close(self) -> None:
        if not self._released:
            # close_notify, so the far end sees a clean end; the inner close right after
            # ends the stream for any Pump still reading it.
            self.tls_stream.close_notify()
        self.inner.close()

    def end(self) -> None:
        if not self._released:
            self.tls_stream.close_notify()
            self.tls_stream.close()  # it watches the inner stream's descriptors no more
        self.inner.end()

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self.tls_stream.close()
        if isinstance(self.tls_stream, SocketTlsStream):
            self.tls_stream.tls.close()  # its own duplicate of the inner socket
        self.inner.release()

    async def wait_closed(self) -> None:
        await self.inner.wait_closed()

    async def why_ended(self, error: OSError | None) -> str | None:
        if isinstance(error, ssl.SSLError):
            reason = openssl_reason(error)
            # An alert: the far end said no to this client, and will say it again.
            self.refused = "alert" in reason
            return alert_message(reason, self.certificate_named)
        return await self.inner.why_ended(error)


async def start_tls(upstream: Upstream, context: ssl.SSLContext, host: str) -> TlsUpstream:
    """The TLS client handshake over `upstream`, checking `host` (a name or an IP literal)."""
    closed = (
        f"{host} closed the connection during the TLS handshake: is this a TLS listener? "
        "(a plaintext listener needs no --tls)"
    )
    if isinstance(upstream, TcpUpstream):
        return await _over_socket(upstream, context, closed, server_hostname=host)
    return await _over_bios(upstream, context, host, closed)


async def accept_tls(client: socket.socket, context: ssl.SSLContext) -> TlsUpstream:
    """The TLS server handshake with a client that connected to a tunnel port (--client-tls)."""
    closed = (
        "the client closed the connection during the TLS handshake (does it trust the "
        "tunnel's CA? its ssl.ca.location is printed at start)"
    )
    return await _over_socket(TcpUpstream(client), context, closed)


async def _over_socket(
    inner: TcpUpstream,
    context: ssl.SSLContext,
    closed: str,
    server_hostname: str | None = None,
) -> TlsUpstream:
    """The handshake on inner's socket, by OpenSSL: a client's, checking server_hostname
    (SNI and the certificate's name), or a server's (server_hostname None, a server
    context). The SSLSocket sits on a duplicate of the socket, so inner keeps its own."""
    duplicate = inner.sock.dup()
    duplicate.setblocking(False)
    try:
        tls = context.wrap_socket(
            duplicate,
            server_side=server_hostname is None,
            server_hostname=server_hostname,
            do_handshake_on_connect=False,
        )
    except BaseException:
        duplicate.close()
        raise
    try:
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await wait_ready(tls.fileno(), writing=False)
            except ssl.SSLWantWriteError:
                await wait_ready(tls.fileno(), writing=True)
            except ssl.SSLCertVerificationError:
                raise
            except (ssl.SSLEOFError, ConnectionError, ssl.SSLZeroReturnError):
                raise ForwarderError(await inner.why_ended(None) or closed) from None
    except BaseException:
        tls.close()
        raise
    return TlsUpstream(inner, SocketTlsStream(tls), tls)


async def _over_bios(
    upstream: Upstream, context: ssl.SSLContext, host: str, closed: str
) -> TlsUpstream:
    """The client handshake over a stream that is not a socket, through memory BIOs."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=host)
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
    if outgoing.pending:  # the last flight (a client's Finished in TLS 1.2)
        await _send(upstream, outgoing.read())
    stream = BioTlsStream(upstream.read_fd, upstream.write_fd, tls, incoming, outgoing)
    return TlsUpstream(upstream, stream, tls)


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
