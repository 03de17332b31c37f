"""Moving one direction of a proxied connection from one file descriptor to another.

A Pump reads its source and writes its sink, asking its Direction (the sans-I/O framing of
that direction) what to send. Bytes the Direction lets pass unread (a Produce request's
record batches, a Fetch answer's records, everything in transparent mode) move by splice(2)
through a pipe, kernel to kernel, never copied into Python: on a laptop whose cores are
shared by client, tunnel and port-forward, the bytes the tunnel does not copy are CPU the
client keeps. The rest is read, framed, perhaps rewritten, and written with writev(2).

With TLS on a side (tls_socket.py), the Pump calls that side's ssl.SSLSocket itself, and
every byte is read and written: OpenSSL reads or writes that socket, so nothing splices.

A Pump reads again only once everything it read is written, so a slow reader on one side
slows the writer on the other: a direction holds one read's worth of bytes, besides a frame
it must hold whole to rewrite (a Metadata answer, say: at most the frame size limit).

File descriptors rather than asyncio transports: splice needs the descriptors, and an event
loop will not watch a descriptor a transport owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import ssl
from collections.abc import Callable

from kafkatunnel.protocol.errors import ProtocolError
from kafkatunnel.protocol.passage import Chunk, Direction
from kafkatunnel.protocol.rewrite import BrokerAddress

log = logging.getLogger("kafkatunnel.relay")
ZERO_COPY = hasattr(os, "splice")  # Linux; elsewhere every byte is read and written
READ_SIZE = 256 << 10
HEAD_READ = 16 << 10  # with splice: read little, so a large frame's body is left to splice
SPLICE_MIN = 16 << 10  # fewer unread bytes than this go with the next read instead
PIPE_SIZE = 256 << 10  # asked of the kernel, which may grant less (a per-user quota)
BURST = 16  # reads per wake-up before other connections get their turn
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
TLS_RECORD = 16 << 10  # the most plaintext one TLS record carries (RFC 8446 5.1)
RETRY_TLS = 0.01  # seconds before retrying a TLS call that waits on the other direction
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)


class ConnectionBug(Exception):
    """Something no input should cause went wrong on one connection: that connection ends,
    saying so; the others and the tunnel go on."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(
            f"internal error: {type(cause).__name__}: {cause} (a kafkatunnel bug: please "
            "report it with the output of -vv)"
        )


def _pipe() -> tuple[int, int, int]:
    """A non-blocking pipe as large as the kernel allows us, and its size."""
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        size = fcntl.fcntl(write_end, _F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:  # above /proc/sys/fs/pipe-max-size, or the user's pipe quota is spent
        size = 64 << 10
    return read_end, write_end, size


class Pump:
    """One direction: source descriptor -> Direction -> sink descriptor.

    on_source_end(cause): the source ended (cause None) or failed (OSError), or its bytes
    broke the protocol (ProtocolError). on_sink_error(error): writing the sink failed.
    Either way the Pump has stopped reading; the owner decides the rest. learn(brokers):
    give brokers an answer names their tunnel addresses before the answer passes on."""

    def __init__(
        self,
        source: int,
        sink: int,
        direction: Direction,
        *,
        zero_copy: bool,
        on_bytes: Callable[[int], None],
        on_source_end: Callable[[BaseException | None], None],
        on_sink_error: Callable[[OSError], None],
        on_chunks: Callable[[list[Chunk]], None] | None = None,
        learn: Callable[[tuple[BrokerAddress, ...]], object] | None = None,
        source_tls: ssl.SSLSocket | None = None,
        sink_tls: ssl.SSLSocket | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.source = source
        self.sink = sink
        self.direction = direction
        # TLS on either side: OpenSSL reads or writes that socket, so nothing can be spliced.
        self.zero_copy = zero_copy and ZERO_COPY and source_tls is None and sink_tls is None
        self.source_tls = source_tls
        self.sink_tls = sink_tls
        self.read_size = HEAD_READ if self.zero_copy else READ_SIZE
        self.on_bytes = on_bytes
        self.on_source_end = on_source_end
        self.on_sink_error = on_sink_error
        self.on_chunks = on_chunks  # what was read and passed on (a transparent recording's)
        self.learn = learn
        self.spliced = 0  # bytes moved without entering Python
        self._out: list[Chunk] = []  # read, not yet written
        self._pipe: tuple[int, int, int] | None = None
        self._in_pipe = 0  # spliced in, not yet spliced out
        self._reading = False
        self._writing = False
        self._stopped = False
        self._closed = False
        # The last read returned less than it asked for: the source had no more then, so
        # the next read waits for the loop (which watches level-triggered), not for EAGAIN.
        self._short = False
        self._drained: asyncio.Future[None] | None = None

    @property
    def pending(self) -> bool:
        return bool(self._out) or self._in_pipe > 0

    def start(self) -> None:
        self._watch_source()

    def stop(self) -> None:
        """Read no more; what was read is still written (see drained)."""
        self._stopped = True
        if self._reading:
            self.loop.remove_reader(self.source)
            self._reading = False

    async def drained(self) -> None:
        """Until what was read is written (or writing it failed)."""
        if not self.pending or not self._writing:
            return
        self._drained = self.loop.create_future()
        await self._drained

    def close(self) -> None:
        """Stop watching both descriptors and free the pipe; the descriptors stay open."""
        self._closed = True
        self.stop()
        if self._writing:
            self.loop.remove_writer(self.sink)
            self._writing = False
        if self._pipe is not None:
            os.close(self._pipe[0])
            os.close(self._pipe[1])
            self._pipe = None
        self._out.clear()
        self._in_pipe = 0
        self._settle()

    # -- reading ----------------------------------------------------------------------------

    def _readable(self) -> None:
        try:
            for _ in range(BURST):
                if not self._read() or not self._flush() or self._short:
                    break
            else:
                if self.source_tls is not None and not self._short:
                    self.loop.call_soon(self._read_on)
        except Exception as error:  # a bug costs this connection, never the event loop
            log.debug("connection bug", exc_info=True)
            self.close()
            self.on_source_end(ConnectionBug(error))

    def _read(self) -> bool:
        """Read once: False if nothing was there, or the source ended."""
        unread = self.direction.unread
        try:
            if self.zero_copy and unread >= SPLICE_MIN:
                return self._splice_in(unread)
            awaited = self.direction.awaited  # of a frame held whole: read it in bulk
            size = min(max(awaited, self.read_size), READ_SIZE)
            if self.source_tls is not None:
                data = self._read_tls(self.source_tls, size)
            else:
                data = os.read(self.source, size)
                self._short = len(data) < size
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
            return False
        except ssl.SSLWantWriteError:  # OpenSSL must send first (a TLS 1.3 KeyUpdate's answer)
            self._pause(self._read_again)
            return False
        except OSError as error:
            self._source_ended(error)
            return False
        if not data:
            self._source_ended(None)
            return False
        self.on_bytes(len(data))
        try:
            chunks = self.direction.feed(data)
            while self.direction.unknown_brokers:
                if self.learn is None:
                    raise RuntimeError("an answer names brokers, and nobody learns them")
                self.learn(self.direction.unknown_brokers)
                chunks += self.direction.resume()
        except ProtocolError as error:
            self._source_ended(error)
            return False
        if self.on_chunks is not None:
            self.on_chunks(chunks)
        self._out.extend(chunks)
        return True

    def _read_tls(self, tls: ssl.SSLSocket, size: int) -> Chunk:
        """Up to size decrypted bytes: OpenSSL gives one record (16 KiB at most) per call,
        so several calls fill one buffer, which then passes on whole, as a socket read's would."""
        buffer = bytearray(size)
        view = memoryview(buffer)
        filled = 0
        while filled < size:
            try:
                got = tls.recv_into(view[filled:])
            except ssl.SSLWantReadError:
                if not filled:
                    raise
                break
            if not got:  # the end (close_notify, or the socket's): the next call says so again
                break
            filled += got
        # A full buffer: OpenSSL may hold more, read from the socket ahead, which the
        # socket will not signal again; read on without waiting for it.
        self._short = filled < size and not tls.pending()
        return view[:filled]

    def _splice_in(self, unread: int) -> bool:
        if self._pipe is None:
            self._pipe = _pipe()
        _, into, size = self._pipe
        wanted = min(unread, size)
        moved = os.splice(self.source, into, wanted, flags=_SPLICE_FLAGS)
        self._short = moved < wanted
        if not moved:
            self._source_ended(None)
            return False
        self.direction.skip(moved)
        self._in_pipe = moved
        self.spliced += moved
        self.on_bytes(moved)
        return True

    def _source_ended(self, cause: BaseException | None) -> None:
        self.stop()
        self.on_source_end(cause)

    # -- writing ----------------------------------------------------------------------------

    def _writable(self) -> None:
        try:
            self._flush()
        except Exception as error:
            log.debug("connection bug", exc_info=True)
            self.close()
            self.on_source_end(ConnectionBug(error))

    def _flush(self) -> bool:
        """Write what was read: True once all of it is written."""
        try:
            while self._in_pipe:
                assert self._pipe is not None
                moved = os.splice(self._pipe[0], self.sink, self._in_pipe, flags=_SPLICE_FLAGS)
                if not moved:
                    raise BrokenPipeError("the sink accepted nothing")
                self._in_pipe -= moved
            if self.sink_tls is not None:
                self._send_tls(self.sink_tls)
            while self._out:
                self._consume(os.writev(self.sink, self._out[:IOV_MAX]))
        except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
            self._watch_sink()
            return False
        except ssl.SSLWantReadError:  # a renegotiation, which Kafka brokers refuse
            self._pause(self._writable)
            return False
        except OSError as error:
            self.close()
            self.on_sink_error(error)
            return False
        if self._writing:
            self.loop.remove_writer(self.sink)
            self._writing = False
        self._settle()
        self._watch_source()
        return True

    def _send_tls(self, tls: ssl.SSLSocket) -> None:
        """Everything read, a chunk per TLS write, small chunks joined up to a record's
        size (a frame's header, say: not a record of its own; large chunks are not copied).
        A write that must wait is repeated with the same bytes, as OpenSSL requires: once
        joined, a chunk and the next no longer fit a record, so the retry joins nothing."""
        out = self._out
        while out:
            if len(out[0]) < TLS_RECORD and len(out) > 1:
                ends, size = 1, len(out[0])
                while ends < len(out) and size + len(out[ends]) <= TLS_RECORD:
                    size += len(out[ends])
                    ends += 1
                if ends > 1:
                    out[:ends] = [b"".join(out[:ends])]
            self._consume(tls.send(out[0]))

    def _consume(self, written: int) -> None:
        out = self._out
        done = 0
        while done < len(out) and written >= len(out[done]):
            written -= len(out[done])
            done += 1
        del out[:done]
        if written:
            out[0] = memoryview(out[0])[written:]

    # -- which descriptor is watched --------------------------------------------------------

    def _watch_source(self) -> None:
        if not self._reading and not self._stopped:
            self.loop.add_reader(self.source, self._readable)
            self._reading = True
            if self.source_tls is not None and not self._short:
                self.loop.call_soon(self._read_on)

    def _read_on(self) -> None:
        """Read what OpenSSL may already hold (see _read_tls), which the socket will not
        signal: only while the Pump still reads."""
        if self._reading:
            self._readable()

    def _read_again(self) -> None:
        """Watch the source again, and read at once what OpenSSL may hold."""
        self._watch_source()
        self._read_on()

    def _pause(self, then: Callable[[], None]) -> None:
        """TLS waits on the other direction: no watching either descriptor (each would wake
        at once, and spin), and `then` a moment later, unless the Pump has closed meanwhile."""
        if self._reading:
            self.loop.remove_reader(self.source)
            self._reading = False
        if self._writing:
            self.loop.remove_writer(self.sink)
            self._writing = False
        self.loop.call_later(RETRY_TLS, lambda: None if self._closed else then())

    def _watch_sink(self) -> None:
        if self._reading:
            self.loop.remove_reader(self.source)
            self._reading = False
        if not self._writing:
            self.loop.add_writer(self.sink, self._writable)
            self._writing = True

    def _settle(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)


async def read_some(fd: int, size: int = READ_SIZE) -> bytes:
    """What a non-blocking descriptor has, once it has something (b"": it ended)."""
    while True:
        try:
            return os.read(fd, size)
        except (BlockingIOError, InterruptedError):
            await wait_ready(fd, writing=False)


async def write_all(fd: int, data: bytes) -> None:
    """All of data into a non-blocking descriptor, waiting for room as needed."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except (BlockingIOError, InterruptedError):
            await wait_ready(fd, writing=True)


async def wait_ready(fd: int, *, writing: bool) -> None:
    """Until the loop sees fd readable (or writable)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    if writing:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        with contextlib.suppress(Exception):
            (loop.remove_writer if writing else loop.remove_reader)(fd)
