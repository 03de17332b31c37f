"""The byte streams a Pump moves between, behind one small interface: read, write, and say
when to try again.

A stream is one strategy chosen once per connection: a plain descriptor (a socket, an exec'd
command's pipes), or TLS (tls/streams.py: OpenSSL on a socket, or over memory BIOs on
pipes). The stream is the one owner of its descriptors' event-loop registrations. That is
what lets TLS share a socket between two directions: the event loop takes one reader and
one writer callback per descriptor, while a TLS read may have to wait until the socket can
be written (a TLS 1.3 KeyUpdate's answer) and a write until it can be read. The stream
registers whatever its two parties wait for, and wakes the party whose wait is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: the exec forwarder's flags are checked without the protocol
    from kafkatunnel.protocol import Chunk

READ_SIZE = 256 << 10  # the most one read takes
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16
Wake = Callable[[], None]
Wait = tuple[int, bool]  # a descriptor, and whether it is awaited writable (else readable)


class ByteStream(ABC):
    """A stream over a readable and a writable descriptor (one socket: the same).

    read(): bytes (b"": the stream ended), None (nothing yet: the reader's wake comes when
    there is), or an OSError. write(out): writes from the front of `out`, deleting what is
    written; True once all is, False when the rest must wait (the writer's wake comes when
    it may go on). A party that waits calls watch_reading (watch_writing) with its wake,
    and None once it waits no more."""

    splices = False  # the descriptors carry the stream's bytes: splice(2) may move them

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.read_fd = read_fd
        self.write_fd = write_fd
        self._reader: Wake | None = None
        self._writer: Wake | None = None
        self._own: Wake | None = None  # the stream's own business (bytes it must send)
        self._read_wait: Wait = (read_fd, False)  # what the reader waits for, unless told
        self._write_wait: Wait = (write_fd, True)  # what the writer (and the stream) wait for
        self._reader_waits = self._read_wait
        self._own_waits = self._write_wait
        # None: the writer waits for the reader's next read (see _writer_waits_for_reader)
        self._writer_waits: Wait | None = self._write_wait
        self._registered: dict[Wait, Wake] = {}
        self._dispatchers: dict[Wait, Wake] = {}
        self._soon: asyncio.Handle | None = None
        self._closed = False

    # -- what a stream does -----------------------------------------------------------------

    @abstractmethod
    def read(self, size: int) -> Chunk | None: ...

    @abstractmethod
    def write(self, out: list[Chunk]) -> bool: ...

    def held(self) -> bool:
        """Bytes the stream holds that its descriptor will not signal (OpenSSL's)."""
        return False

    def close(self) -> None:
        """Watch nothing any more; the descriptors are their owner's to close."""
        self._closed = True
        self._reader = self._writer = self._own = None
        self._update()
        if self._soon is not None:
            self._soon.cancel()

    # -- who waits for what ---------------------------------------------------------------

    def watch_reading(self, wake: Wake | None) -> None:
        """Call `wake` whenever a read may give something (None: no more)."""
        self._reader = wake
        self._update()
        if wake is not None and self.held():
            self._wake_reader_soon()

    def watch_writing(self, wake: Wake | None) -> None:
        """Call `wake` whenever a write may go on (None: no more)."""
        self._writer = wake
        self._update()

    def _reader_waits_for(self, wait: Wait) -> None:
        """The reader's next read waits for this, not for its own descriptor."""
        self._reader_waits = wait
        self._update()

    def _writer_waits_for(self, wait: Wait) -> None:
        self._writer_waits = wait
        self._update()

    def _writer_waits_for_reader(self) -> None:
        """The writer's next write waits until the reader has read: a TLS write that needs
        the far end's bytes (a renegotiation's) must not take them itself, nor poll for
        them while the reader is paused. Application data may come first, which only a
        read takes (OpenSSL fails a write that meets it). Bytes the stream holds wake the
        reader now; a paused reader reads once it watches again."""
        self._writer_waits = None
        self._update()
        if self.held():
            self._wake_reader_soon()

    def _read_done(self) -> None:
        """The reader has read: a writer that waited for it writes again."""
        self._writer_waits = self._write_wait
        self._update()

    def _own_wait(self, wake: Wake | None) -> None:
        """The stream itself waits for room on its write descriptor (None: no more)."""
        self._own = wake
        self._update()

    def _wake_reader_soon(self) -> None:
        """Read what the stream holds, which no descriptor will signal."""
        if self._soon is None and self._reader is not None:
            self._soon = self.loop.call_soon(self._held_wake)

    def _held_wake(self) -> None:
        self._soon = None
        if self._reader is not None:
            self._reader()

    def _update(self) -> None:
        """Register what the parties wait for, and nothing else: a party alone on its own
        descriptor's readiness directly (the usual case: no call between the loop and the
        Pump), others through _ready, which wakes whoever waited."""
        wanted: dict[Wait, Wake] = {}
        waits: tuple[tuple[Wake | None, Wait | None, Wait], ...] = (
            (self._reader, self._reader_waits, self._read_wait),
            (self._writer, self._writer_waits, self._write_wait),
            (self._own, self._own_waits, self._write_wait),
        )
        for wake, wait, own in waits:
            if wake is not None and wait is not None:
                shared = wait in wanted or wait != own
                wanted[wait] = self._dispatcher(wait) if shared else wake
        registered = self._registered
        if wanted == registered:
            return
        loop = self.loop
        for fd, writing in registered.keys() - wanted.keys():
            (loop.remove_writer if writing else loop.remove_reader)(fd)
        for (fd, writing), wake in wanted.items():
            if registered.get((fd, writing)) != wake:
                (loop.add_writer if writing else loop.add_reader)(fd, wake)
        self._registered = wanted

    def _dispatcher(self, wait: Wait) -> Wake:
        found = self._dispatchers.get(wait)
        if found is None:
            found = self._dispatchers[wait] = functools.partial(self._ready, wait)
        return found

    def _ready(self, wait: Wait) -> None:
        """A descriptor is ready: wake each party that waited for it."""
        woken: list[Wake] = []
        own, reader, writer = self._own, self._reader, self._writer
        if own is not None and self._own_waits == wait:
            woken.append(own)
        if reader is not None and self._reader_waits == wait:
            woken.append(reader)
        if writer is not None and self._writer_waits == wait:
            woken.append(writer)
        if wait == self._reader_waits != self._read_wait:  # it waited for the other's
            self._reader_waits = self._read_wait
            self._update()
        if wait == self._writer_waits != self._write_wait:
            self._writer_waits = self._write_wait
            self._update()
        if len(woken) == 1:
            woken[0]()
            return
        for wake in woken:  # unless an earlier wake made that party stop waiting
            if wake in (self._own, self._reader, self._writer):
                wake()

    # -- outside the relay (probes, discovery, handshakes) ----------------------------------

    async def send(self, data: bytes) -> None:
        """All of data into the stream."""
        out: list[Chunk] = [memoryview(data)]
        while not self.write(out):
            await self._until(self.watch_writing)

    async def receive(self, size: int = READ_SIZE) -> bytes:
        """What the stream has, once it has something (b"": it ended)."""
        while (data := self.read(size)) is None:
            await self._until(self.watch_reading)
        return bytes(data)

    async def _until(self, watch: Callable[[Wake | None], None]) -> None:
        ready: asyncio.Future[None] = self.loop.create_future()
        watch(lambda: None if ready.done() else ready.set_result(None))
        try:
            await ready
        finally:
            if not self._closed:
                watch(None)


def consume(out: list[Chunk], written: int) -> None:
    """Delete `written` bytes from the front of `out`."""
    done = 0
    while done < len(out) and written >= len(out[done]):
        written -= len(out[done])
        done += 1
    del out[:done]
    if written:
        out[0] = memoryview(out[0])[written:]


class PlainStream(ByteStream):
    """The bytes as the descriptors carry them."""

    splices = True

    def read(self, size: int) -> Chunk | None:
        try:
            return os.read(self.read_fd, size)
        except (BlockingIOError, InterruptedError):
            return None

    def write(self, out: list[Chunk]) -> bool:
        try:
            if len(out) == 1:  # most reads pass on as one chunk
                written = os.write(self.write_fd, out[0])
                if written == len(out[0]):
                    out.clear()
                    return True
                consume(out, written)
            while out:
                consume(out, os.writev(self.write_fd, out[:IOV_MAX]))
        except (BlockingIOError, InterruptedError):
            return False
        return True


async def wait_ready(fd: int, *, writing: bool) -> None:
    """Until the loop sees fd readable (or writable): for a descriptor no stream owns yet
    (a TLS handshake's)."""
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
