"""TLS over a TCP socket that OpenSSL reads and writes itself: how the tunnel speaks TLS on
every stream that is a socket (a direct connection, a kubectl port-forward's local port, a
client of --client-tls).

The relay's Pumps call the ssl.SSLSocket's recv_into and send on their own descriptor,
so every byte costs one kernel copy and OpenSSL's cipher, as in a TLS-originating relay
written in C (socat's OPENSSL address). The memory-BIO bridge (tls_stream.py) remains for
streams that are not sockets (an exec'd command's pipes), where OpenSSL has nothing to
read. The SSLSocket sits on a duplicate of the inner upstream's descriptor, so the inner
upstream keeps what it owns (closing, releasing, a kubectl forward's bookkeeping).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import ssl
import sys

from kafkatunnel.tunnel.certificates import alert_message, openssl_reason
from kafkatunnel.tunnel.forwarders import ForwarderError, TcpUpstream, Upstream
from kafkatunnel.tunnel.relay import READ_SIZE, wait_ready

log = logging.getLogger("kafkatunnel.tls")
BULK_READ = 256 << 10  # what OpenSSL asks of the socket per read, once reading in bulk
_SSL_CTRL_SET_READ_AHEAD, _SSL_CTRL_GET_READ_AHEAD = 41, 40  # include/openssl/ssl.h


def read_in_bulk(context: ssl.SSLContext) -> bool:
    """Have OpenSSL read the socket up to BULK_READ bytes at a time (read-ahead), not twice
    per TLS record (its 5-byte header, then its body): one read(2) per 256 KiB instead of
    thirty-two. The ssl module offers no such setting, so this reaches the SSL_CTX under a
    CPython SSLContext, after checking that what it found there is one (its options and
    verify mode read back as the SSLContext's); False: left as it was."""
    if sys.implementation.name != "cpython":
        return False
    try:
        library = ctypes.CDLL(ssl._ssl.__file__)  # type: ignore[attr-defined]
        control = library.SSL_CTX_ctrl
        control.restype, control.argtypes = (
            ctypes.c_long,
            [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p],
        )
        options = library.SSL_CTX_get_options
        options.restype, options.argtypes = ctypes.c_uint64, [ctypes.c_void_p]
        verify_mode = library.SSL_CTX_get_verify_mode
        verify_mode.restype, verify_mode.argtypes = ctypes.c_int, [ctypes.c_void_p]
        buffer_len = library.SSL_CTX_set_default_read_buffer_len
        buffer_len.restype, buffer_len.argtypes = None, [ctypes.c_void_p, ctypes.c_size_t]
        # CPython's PySSLContext: PyObject_HEAD, then the SSL_CTX pointer.
        pointer = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
    except (OSError, AttributeError, ValueError):
        return False
    if not pointer:
        return False
    expected_verify = {ssl.CERT_NONE: 0, ssl.CERT_OPTIONAL: 1, ssl.CERT_REQUIRED: 3}
    if (
        options(pointer) != int(context.options)
        or verify_mode(pointer) != expected_verify[context.verify_mode]
        or control(pointer, _SSL_CTRL_GET_READ_AHEAD, 0, None) not in (0, 1)
    ):
        log.debug("not an SSL_CTX where one was expected: TLS reads stay per record")
        return False
    buffer_len(pointer, BULK_READ)
    control(pointer, _SSL_CTRL_SET_READ_AHEAD, 1, None)
    return bool(control(pointer, _SSL_CTRL_GET_READ_AHEAD, 0, None) == 1)


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
