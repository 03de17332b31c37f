"""TLS byte streams (tls/streams.py) under the relay's Pump, on both paths: OpenSSL on the
socket itself, and ssl.SSLObject over memory BIOs (as on an exec'd command's pipes). Real
TLS sessions between two ends of a TCP connection on loopback, certificates from a CA the
test makes."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import socket
import ssl
import struct
import subprocess
import termios
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kafkatunnel.demo import free_port
from kafkatunnel.protocol import Chunk, PassThrough
from kafkatunnel.tunnel.relay import Pump
from kafkatunnel.tunnel.streams import READ_SIZE, ByteStream, PlainStream
from kafkatunnel.tunnel.tls import TlsOptions, client_context
from kafkatunnel.tunnel.tls.streams import TLS_RECORD, BioTlsStream, SocketTlsStream
from kafkatunnel.waiting import wait_for
from tests.pki import Issued, TestAuthority

pytestmark = pytest.mark.quick

T = TypeVar("T")

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
    stream = _client_stream(client, context, via)
    handshake.join(10)
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


# A broker that renegotiates (TLS 1.2): `openssl s_server`, which sends what its stdin
# gives and renegotiates at a line "r"; the test stops and continues it to order its bytes.
D_SIZE = 128 << 10  # application data the broker sends first: more than the client takes
TRIES = 200  # event loop turns a waiting write is given to show whether it polls


class RenegotiatingServer:
    def __init__(self, issued: Issued) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            ["openssl", "s_server", "-tls1_2", "-naccept", "1", "-accept",
             f"127.0.0.1:{self.port}", "-cert", str(issued.cert), "-key", str(issued.key)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.output = bytearray()  # what it printed: what it received among it
        self._reader = threading.Thread(target=self._read_output, daemon=True)
        self._reader.start()

    def _read_output(self) -> None:
        assert self.process.stdout is not None
        while data := os.read(self.process.stdout.fileno(), 1 << 16):
            self.output += data

    def send(self, line: bytes) -> None:
        """`line` to its stdin: sent to the client, or a command ("r\\n": renegotiate)."""
        assert self.process.stdin is not None
        self.process.stdin.write(line)
        self.process.stdin.flush()

    def pause(self, paused: bool) -> None:
        os.kill(self.process.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def close(self) -> None:
        self.process.kill()
        self.process.wait(10)


def _record_types(sock: socket.socket) -> list[int]:
    """The types of the whole TLS records waiting in sock's kernel buffer, unread."""
    try:
        data = sock.recv(1 << 20, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return []
    types, at = [], 0
    while at + 5 <= len(data) and at + 5 + int.from_bytes(data[at + 3 : at + 5], "big") <= len(
        data
    ):
        types.append(data[at])
        at += 5 + int.from_bytes(data[at + 3 : at + 5], "big")
    return types


def _arrived(sock: socket.socket) -> int:
    return int(struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, b"\0\0\0\0"))[0])


@pytest.mark.parametrize("uvloop", [False, True], ids=["asyncio", "uvloop"])
@pytest.mark.parametrize("via", ["socket", "bio"])
def test_a_write_that_needs_the_brokers_bytes_waits_for_the_reader_without_polling(
    tmp_path: Path, via: str, uvloop: bool
) -> None:
    """The broker renegotiates: the client's reader takes its HelloRequest with a load of
    answers, then pauses (its client reads nothing); the broker sends more application data,
    then its handshake. A request written meanwhile needs the handshake's bytes. It must
    neither poll the readable socket (a busy loop) nor take those bytes itself (OpenSSL
    fails a write that meets application data): it waits until the reader, reading again,
    has taken them; then everything arrives, both ways."""
    ca = TestAuthority(tmp_path)
    server = RenegotiatingServer(ca.issue("server", ["localhost"]))
    context = client_context(TlsOptions(ca.pem))
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    # More application data during the renegotiation, on the BIO path: OpenSSL on a socket
    # reads in the write itself, and fails a write that meets application data first.
    later = b"X-later\n" if via == "bio" else b""  # no line may start with a command letter
    answers = b"." * D_SIZE
    try:
        client = wait_for(lambda: _connected(server.port), timeout=10, what="s_server")
        client.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
        kernel = socket.socket(fileno=os.dup(client.fileno()))  # to look at, not to read
        stream = _client_stream(client, context, via)
        server.send(answers)
        wait_for(lambda: _arrived(kernel) >= D_SIZE, timeout=10, what="the answers")
        before = _arrived(kernel)
        server.send(b"r\n")  # renegotiate: a HelloRequest
        wait_for(lambda: _arrived(kernel) > before, timeout=10, what="the HelloRequest")
        server.pause(True)  # it gets the client's hello only once it has sent `later`
        got, writes, failed = _run(_relay(stream, kernel, server, answers, later), uvloop)
    finally:
        server.pause(False)
        server.close()
        client.close()
        kernel.close()
    assert failed == [], failed
    assert got == answers + later
    assert writes <= 5, f"{writes} writes in {TRIES} turns: the write polls"
    assert b"a request" in server.output


async def _relay(
    stream: Callable[[], ByteStream], client: socket.socket, server: RenegotiatingServer,
    answers: bytes, later: bytes,
) -> tuple[bytes, int, list[BaseException | None]]:  # fmt: skip
    """The answers' Pump (TLS -> a client that stops reading) and the requests' Pump (a
    client -> TLS); what the answers' client got in the end, how many writes the requests'
    Pump tried while it waited, and why a Pump ended, if one did."""
    loop = asyncio.get_running_loop()
    tls = stream()
    answers_out, answers_in = socket.socketpair()
    answers_out.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 10)
    requests_in, requests_out = socket.socketpair()
    for sock in (answers_out, answers_in, requests_in):
        sock.setblocking(False)
    failed: list[BaseException | None] = []
    writes = 0
    write = tls.write

    def counted(out: list[Chunk]) -> bool:
        nonlocal writes
        writes += 1
        return write(out)

    tls.write = counted  # type: ignore[method-assign]
    pumps = [
        Pump(tls, PlainStream(answers_out.fileno(), answers_out.fileno()),
             PassThrough().responses, zero_copy=True, on_bytes=lambda _: None,
             on_source_end=failed.append, on_sink_error=failed.append),
        Pump(PlainStream(requests_in.fileno(), requests_in.fileno()), tls,
             PassThrough().requests, zero_copy=True, on_bytes=lambda _: None,
             on_source_end=failed.append, on_sink_error=failed.append),
    ]  # fmt: skip
    try:
        for pump in pumps:
            pump.start()
        await asyncio.wait_for(_until(lambda: pumps[0].pending and not _arrived(client)), 10)
        if later:
            server.send(later)
        # It sends `later` and takes the client's hello, in either order (once blocked in
        # the handshake, it sends `later` after it), and answers with its handshake.
        server.pause(False)
        await asyncio.wait_for(_until(lambda: 22 in _record_types(client)), 10)
        requests_out.sendall(b"a request\n")
        writes = 0
        for _ in range(TRIES):
            await asyncio.sleep(0)
        waited = writes
        got = bytearray()  # the client reads: the answers' Pump goes on
        while len(got) < len(answers) + len(later) and not failed:
            got += await asyncio.wait_for(loop.sock_recv(answers_in, 1 << 20), 10)
        await asyncio.wait_for(_until(lambda: b"a request" in server.output or bool(failed)), 10)
    finally:
        for pump in pumps:
            pump.close()
        tls.close()
        for sock in (answers_out, answers_in, requests_in, requests_out):
            sock.close()
    return bytes(got), waited, failed


def _connected(port: int) -> socket.socket | None:
    try:
        return socket.create_connection(("127.0.0.1", port))
    except ConnectionRefusedError:
        return None


def _client_stream(
    client: socket.socket, context: ssl.SSLContext, via: str
) -> Callable[[], ByteStream]:
    """The handshake (blocking), then a factory of the client's TLS stream on path `via`."""
    if via == "socket":
        tls = context.wrap_socket(client, server_hostname="localhost")
        tls.setblocking(False)
        return lambda: SocketTlsStream(tls)
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
    client.setblocking(False)
    fd = client.fileno()
    return lambda: BioTlsStream(fd, fd, session, incoming, outgoing)


def _run(main: Coroutine[Any, Any, T], uvloop: bool) -> T:
    if uvloop:
        import uvloop as uv

        return uv.run(main)
    return asyncio.run(main)
