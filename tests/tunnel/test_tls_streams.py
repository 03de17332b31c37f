"""TLS byte streams (tls/streams.py) under the relay's Pump, on both paths: OpenSSL on the
socket itself, and ssl.SSLObject over memory BIOs (as on an exec'd command's pipes). Real
TLS sessions between two ends of a TCP connection on loopback, certificates from a CA the
test makes."""

from __future__ import annotations

import asyncio
import fcntl
import socket
import ssl
import struct
import termios
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kafkatunnel.protocol import PassThrough
from kafkatunnel.tunnel.relay import Pump
from kafkatunnel.tunnel.streams import READ_SIZE, ByteStream, PlainStream
from kafkatunnel.tunnel.tls import TlsOptions, client_context
from kafkatunnel.tunnel.tls.streams import TLS_RECORD, BioTlsStream, SocketTlsStream
from kafkatunnel.waiting import wait_for
from tests.pki import TestAuthority

# Plaintext per TLS record: a full one first (so the stream reads in bulk), then records
# of a size that divides no buffer, so a full read ends inside the last record, which
# OpenSSL holds decrypted, the socket empty.
FIRST, RECORD = TLS_RECORD, 10_000
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33  # Linux: beyond wmem_max/rmem_max, as root


def _unsent(sock: socket.socket) -> int:
    """Bytes written to sock that its peer has not yet received (SIOCOUTQ)."""
    return int(struct.unpack("i", fcntl.ioctl(sock, termios.TIOCOUTQ, b"\0\0\0\0"))[0])


@contextmanager
def _session(
    ca: TestAuthority, context: ssl.SSLContext, via: str
) -> Iterator[tuple[Callable[[], ByteStream], ssl.SSLSocket]]:
    """(client, server): a TLS session over loopback TCP whose buffers hold 8 MiB unread,
    the client's with `context` (a factory of its stream, on the path `via`), the server's
    certificate from `ca`."""
    issued = ca.issue("server", ["localhost"])
    serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    serving.load_cert_chain(issued.cert, issued.key)
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
    client.connect(listener.getsockname())
    accepted, _ = listener.accept()
    listener.close()
    accepted.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, 8 << 20)
    server: list[ssl.SSLSocket] = []
    handshake = threading.Thread(
        target=lambda: server.append(serving.wrap_socket(accepted, server_side=True))
    )
    handshake.start()
    if via == "socket":
        mine = context.wrap_socket(client, server_hostname="localhost")
        handshake.join(10)
        mine.setblocking(False)
        stream: Callable[[], ByteStream] = lambda: SocketTlsStream(mine)  # noqa: E731
    else:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        session = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
        while True:
            try:
                session.do_handshake()
                break
            except ssl.SSLWantReadError:
                pass
            client.sendall(outgoing.read())
            incoming.write(client.recv(1 << 16))
        client.sendall(outgoing.read())
        handshake.join(10)
        client.setblocking(False)
        fd = client.fileno()
        stream = lambda: BioTlsStream(fd, fd, session, incoming, outgoing)  # noqa: E731
    try:
        yield stream, server[0]
    finally:
        client.close()
        server[0].close()


@pytest.mark.parametrize("via", ["socket", "bio"])
def test_a_pump_resumes_with_records_openssl_already_holds(tmp_path: Path, via: str) -> None:
    """A full read leaves records inside OpenSSL while the socket is empty and quiet; the
    client then stalls the Pump. When it reads again, those records must still come: the
    socket will never say it is readable."""
    records = -(-(READ_SIZE - FIRST) // RECORD)  # the fewest whole records past one full read
    size = FIRST + records * RECORD
    payload = (bytes(range(256)) * (size // 256 + 1))[:size]

    async def relay(client: Callable[[], ByteStream]) -> bytes:
        out, sink = socket.socketpair()
        out.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 10)
        out.setblocking(False)
        ended: list[BaseException | None] = []  # why the Pump stopped, if it did
        pump = Pump(
            client(),
            PlainStream(out.fileno(), out.fileno()),
            PassThrough().responses,
            zero_copy=True,
            on_bytes=lambda _: None,
            on_source_end=ended.append,
            on_sink_error=ended.append,
        )
        pump.start()
        await asyncio.sleep(0)  # the Pump reads, fills its buffer, and finds the sink full
        await asyncio.wait_for(_until(lambda: pump.pending), 10)
        sink.setblocking(False)
        received = bytearray()
        loop = asyncio.get_running_loop()
        while len(received) < len(payload):
            received += await asyncio.wait_for(loop.sock_recv(sink, 1 << 20), 10)
        pump.close()
        out.close()
        sink.close()
        assert not ended, ended
        return bytes(received)

    ca = TestAuthority(tmp_path)
    with _session(ca, client_context(TlsOptions(ca.pem)), via) as (client, server):
        server.sendall(payload[:FIRST])  # all of it waits in the kernel
        for start in range(FIRST, len(payload), RECORD):
            server.sendall(payload[start : start + RECORD])
        wait_for(
            lambda: _unsent(server) == 0, timeout=10, what="the records in the client's kernel"
        )
        assert asyncio.run(relay(client)) == payload


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)
