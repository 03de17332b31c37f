"""TLS over a TCP socket that OpenSSL reads and writes itself: how the tunnel speaks TLS on
every stream that is a socket (a direct connection, a kubectl port-forward's local port, a
client of --client-tls).

The relay's Pumps call the ssl.SSLSocket's recv_into and send on their own descriptor,
so every byte costs one kernel copy and OpenSSL's cipher, as in a TLS-originating relay
written in C (socat's OPENSSL address), and OpenSSL reads as the ssl module sets it up: a
record at a time. The memory-BIO bridge (tls_stream.py) remains for streams that are not
sockets (an exec'd command's pipes), where OpenSSL has nothing to read. The SSLSocket sits
on a duplicate of the inner upstream's descriptor, so the inner upstream keeps what it owns
(closing, releasing, a kubectl forward's bookkeeping).
"""

from __future__ import annotations

import contextlib
import ssl

from kafkatunnel.tunnel.certificates import alert_message, openssl_reason
from kafkatunnel.tunnel.forwarders import ForwarderError, TcpUpstream, Upstream
from kafkatunnel.tunnel.relay import READ_SIZE, wait_ready


class SocketTlsUpstream(Upstream):
    """An established TLS session over `inner`'s socket; the relay uses `ssl_socket` directly."""

    ssl_socket: ssl.SSLSocket

    def __init__(self, inner: TcpUpstream, tls: ssl.SSLSocket) -> None:
        self.inner = inner
        self.ssl_socket = tls
        self.version = tls.version() or "TLS"
        self.certificate = tls.getpeercert(binary_form=True)
        self.read_fd = self.write_fd = tls.fileno()
        self._released = False
        inner.on_gone = self._inner_gone

    def _inner_gone(self) -> None:
        if self.on_gone is not None:
            self.on_gone()

    def close(self) -> None:
        if not self._released:
            # close_notify, so the far end sees a clean end; the shutdown right after ends
            # the stream for any Pump still reading it.
            with contextlib.suppress(OSError, ValueError):
                self.ssl_socket.unwrap()
        self.inner.close()

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self.ssl_socket.close()
        self.inner.release()

    async def wait_closed(self) -> None:
        await self.inner.wait_closed()

    async def why_ended(self, error: OSError | None) -> str | None:
        if isinstance(error, ssl.SSLError):
            reason = openssl_reason(error)
            # An alert: the far end said no to this client, and will say it again.
            self.refused = "alert" in reason
            return alert_message(reason)
        return await self.inner.why_ended(error)

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[self.ssl_socket.send(view) :]
            except ssl.SSLWantWriteError:
                await wait_ready(self.write_fd, writing=True)
            except ssl.SSLWantReadError:  # a renegotiation, which Kafka brokers refuse
                await wait_ready(self.read_fd, writing=False)

    async def receive(self, size: int = READ_SIZE) -> bytes:
        while True:
            try:
                return self.ssl_socket.recv(size)
            except ssl.SSLWantReadError:
                await wait_ready(self.read_fd, writing=False)
            except ssl.SSLWantWriteError:
                await wait_ready(self.write_fd, writing=True)


async def handshake(
    inner: TcpUpstream,
    context: ssl.SSLContext,
    closed: str,
    server_hostname: str | None = None,
) -> SocketTlsUpstream:
    """The TLS handshake over inner's socket: a client's, checking server_hostname (SNI
    and the certificate's name), or a server's (server_hostname None, a server context)."""
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
    return SocketTlsUpstream(inner, tls)
