"""Moving one direction of a proxied connection from one file descriptor to another.

A Pump reads its source and writes its sink, asking its Direction (the sans-I/O framing of
that direction) what to send. Bytes the Direction lets pass unread (a Produce request's
record batches, a Fetch answer's records, everything in transparent mode) move by splice(2)
through a pipe, kernel to kernel, never copied into Python: on a laptop whose cores are
shared by client, tunnel and port-forward, the bytes the tunnel does not copy are CPU the
client keeps. The rest is read, framed, perhaps rewritten, and written with writev(2).

The Pump reads and writes ByteStreams (streams.py), the same way whatever they are; only
when both are plain descriptors may bytes splice (through TLS every byte is read, to be
decrypted or encrypted).

A Pump reads again only once everything it read is written, so a slow reader on one side
slows the writer on the other: a direction holds one read's worth of bytes, besides a frame
it must hold whole to rewrite (a Metadata answer, say: at most the frame size limit).

Descriptors rather than asyncio transports: splice needs the descriptors, and an event
loop will not watch a descriptor a transport owns.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NamedTuple

from kafkatunnel.protocol import (
    BrokerAddress,
    Chunk,
    DeployedAsk,
    Direction,
    Fed,
    FramePassed,
    ProtocolError,
    RequestHeader,
)
from kafkatunnel.tunnel.streams import READ_SIZE, ByteStream

log = logging.getLogger("kafkatunnel.relay")
ZERO_COPY = hasattr(os, "splice")  # Linux; elsewhere every byte is read and written
HEAD_READ = 16 << 10  # with splice: read little, so a large frame's body is left to splice
SPLICE_MIN = 16 << 10  # fewer unread bytes than this go with the next read instead
PIPE_SIZE = 256 << 10  # asked of the kernel, which may grant less (a per-user quota)
BURST = 16  # reads per wake-up before other connections get their turn
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)


class ConnectionBug(Exception):
    """Something no input should cause went wrong on one connection: that connection ends,
    saying so; the others and the tunnel go on."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(
            f"internal error: {type(cause).__name__}: {cause} (a kafkatunnel bug: please "
            "report it with the output of -vv)"
        )


class Pipe(NamedTuple):
    read_end: int
    write_end: int
    size: int  # what the kernel granted


def _pipe() -> Pipe:
    """A non-blocking pipe as large as the kernel allows us."""
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        size = fcntl.fcntl(write_end, _F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:  # above /proc/sys/fs/pipe-max-size, or the user's pipe quota is spent
        size = 64 << 10
    return Pipe(read_end, write_end, size)


class Pump:
    """One direction: source stream -> Direction -> sink stream.

    on_source_end(cause): the source ended (cause None) or failed (OSError), or its bytes
    broke the protocol (ProtocolError). on_sink_error(error): writing the sink failed.
    Either way the Pump has stopped reading; the owner decides the rest. learn(brokers):
    give brokers an answer names their tunnel addresses before the answer passes on.
    on_refused(headers): requests the Direction refused (its answers come the usual way).
    ask_deployed(ask): a request waits for the deployed groups' offsets (up --isolate
    --isolate-from-deployed): the coroutine asks them and hands the Exchange the answers;
    the Pump reads nothing meanwhile, then resumes."""

    def __init__(
        self,
        source: ByteStream,
        sink: ByteStream,
        direction: Direction,
        *,
        zero_copy: bool,
        on_bytes: Callable[[int], None],
        on_source_end: Callable[[BaseException | None], None],
        on_sink_error: Callable[[OSError], None],
        on_chunks: Callable[[list[Chunk]], None] | None = None,
        on_frames: Callable[[Sequence[FramePassed]], None] | None = None,
        learn: Callable[[tuple[BrokerAddress, ...]], object] | None = None,
        on_refused: Callable[[Sequence[RequestHeader]], None] | None = None,
        ask_deployed: Callable[[DeployedAsk], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.source = source
        self.sink = sink
        self.direction = direction
        self.zero_copy = zero_copy and ZERO_COPY and source.splices and sink.splices
        self.read_size = HEAD_READ if self.zero_copy else READ_SIZE
        self.on_bytes = on_bytes
        self.on_source_end = on_source_end
        self.on_sink_error = on_sink_error
        self.on_chunks = on_chunks  # what was read and passed on (a transparent recording's)
        self.on_frames = on_frames  # frames that passed on whole (an observed Exchange's)
        self.learn = learn
        self.on_refused = on_refused
        self.ask_deployed = ask_deployed
        self._asking: asyncio.Task[None] | None = None  # the deployed offsets, being asked
        self._observed = on_chunks is not None or on_frames is not None
        self.spliced = 0  # bytes moved without entering Python
        self._out: list[Chunk] = []  # read, not yet written
        self._pipe: Pipe | None = None
        self._in_pipe = 0  # spliced in, not yet spliced out
        self._reading = False
        self._writing = False
        self._stopped = False
        self._holding = False  # the owner reads the source meanwhile (see hold)
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
        self._unwatch_source()

    def hold(self) -> None:
        """Read nothing until release(): the owner reads the source itself meanwhile (the
        tunnel's re-authentication reads the broker's answers to it)."""
        self._holding = True
        self._unwatch_source()

    def release(self) -> None:
        """Read the source again, after hold()."""
        self._holding = False
        if not self.pending:
            self._watch_source()

    def go_on(self, unpause: Callable[[], Fed]) -> None:
        """Unpause the direction (`unpause` does): write what it held back, then read on.
        Bad bytes among those held end the source as bad bytes read would."""
        try:
            self._take(unpause())
        except ProtocolError as error:
            self._broken(error)
            return
        try:
            self._flush()
        except Exception as error:  # a bug costs this connection, never the event loop
            log.debug("connection bug", exc_info=True)
            self.close()
            self.on_source_end(ConnectionBug(error))

    async def drained(self) -> None:
        """Until what was read is written (or writing it failed)."""
        if not self.pending or not self._writing:
            return
        self._drained = self.loop.create_future()
        await self._drained

    def close(self) -> None:
        """Stop watching both streams and free the pipe; the streams stay open."""
        self.stop()
        if self._asking is not None:
            self._asking.cancel()
        if self._writing:
            self.sink.watch_writing(None)
            self._writing = False
        if self._pipe is not None:
            os.close(self._pipe.read_end)
            os.close(self._pipe.write_end)
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
        except Exception as error:  # a bug costs this connection, never the event loop
            log.debug("connection bug", exc_info=True)
            self.close()
            self.on_source_end(ConnectionBug(error))

    def _read(self) -> bool:
        """Read once: False if nothing was there, or the source ended, or the direction
        is paused (then the source is no longer watched until go_on)."""
        direction = self.direction
        if direction.pausing and direction.paused:  # an attribute, then (rarely) a property
            self._unwatch_source()
            return False
        if self._holding:  # the deployed offsets are being asked (see _ask)
            return False
        try:
            if self.zero_copy and (unread := direction.unread) >= SPLICE_MIN:
                return self._splice_in(unread)
            size = self.read_size
            awaited = direction.awaited  # of a frame held whole: read it in bulk
            if awaited > size:
                size = min(awaited, READ_SIZE)
            data = self.source.read(size)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as error:
            self._source_ended(error)
            return False
        if data is None:
            return False
        if not data:
            self._source_ended(None)
            return False
        self._short = len(data) < size
        self.on_bytes(len(data))
        try:
            self._take(direction.feed(data))
        except ProtocolError as error:
            self._broken(error)
            return False
        return True

    def _take(self, fed: Fed) -> None:
        """What the direction let pass, to be written (and observed, and its unknown brokers
        learned first)."""
        if self._observed:
            self._pass_on(fed)
        else:
            self._out += fed.out
        if fed.refused and self.on_refused is not None:
            self.on_refused(fed.refused)
        while fed.unknown_brokers:
            if self.learn is None:
                raise RuntimeError("an answer names brokers, and nobody learns them")
            self.learn(fed.unknown_brokers)
            fed = self.direction.resume()
            self._pass_on(fed)
        if fed.deployed_wanted is not None:
            self._ask(fed.deployed_wanted)

    def _ask(self, ask: DeployedAsk) -> None:
        """Read nothing until the deployed groups' offsets are asked, then go on."""
        if self.ask_deployed is None:
            raise RuntimeError("a request waits for deployed offsets, and nobody asks them")
        self.hold()
        self._asking = self.loop.create_task(self.ask_deployed(ask))
        self._asking.add_done_callback(self._asked)

    def _asked(self, task: asyncio.Task[None]) -> None:
        self._asking = None
        if self._stopped or task.cancelled():
            return
        error = task.exception()
        if error is not None:  # ask_deployed never raises: a bug
            self.close()
            bug = error if isinstance(error, Exception) else Exception(repr(error))
            self.on_source_end(ConnectionBug(bug))
            return
        self.release()
        self.go_on(self.direction.resume)

    def _broken(self, error: ProtocolError) -> None:
        """The source's bytes broke the protocol: what passed before them (whole frames
        ahead of the bad one) is still written, then the owner hears of the error."""
        before = self.direction.taken_before_error()
        self._pass_on(before)
        if before.refused and self.on_refused is not None:
            self.on_refused(before.refused)
        self._source_ended(error)
        self._flush()

    def _pass_on(self, fed: Fed) -> None:
        if self.on_chunks is not None:
            self.on_chunks(fed.out)
        if fed.frames and self.on_frames is not None:
            self.on_frames(fed.frames)
        self._out.extend(fed.out)

    def _splice_in(self, unread: int) -> bool:
        if self._pipe is None:
            self._pipe = _pipe()
        wanted = min(unread, self._pipe.size)
        moved = os.splice(self.source.read_fd, self._pipe.write_end, wanted, flags=_SPLICE_FLAGS)
        self._short = moved < wanted
        if not moved:
            self._source_ended(None)
            return False
        self._in_pipe = moved
        self.spliced += moved
        self.on_bytes(moved)
        try:  # the frame's end may come with the records: its walk ends, and may fail
            frames = self.direction.skip(moved)
        except ProtocolError as error:
            self._broken(error)
            return False
        if frames and self.on_frames is not None:
            self.on_frames(frames)
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
                moved = os.splice(self._pipe.read_end, self.sink.write_fd, self._in_pipe,
                                  flags=_SPLICE_FLAGS)  # fmt: skip
                if not moved:
                    raise BrokenPipeError("the sink accepted nothing")
                self._in_pipe -= moved
            written = self.sink.write(self._out)
        except (BlockingIOError, InterruptedError):
            written = False
        except OSError as error:
            self.close()
            self.on_sink_error(error)
            return False
        if not written:
            self._watch_sink()
            return False
        if self._writing:
            self.sink.watch_writing(None)
            self._writing = False
        if self._drained is not None:
            self._settle()
        if not self._reading:
            self._watch_source()
        return True

    # -- which stream is watched ------------------------------------------------------------

    def _watch_source(self) -> None:
        if not (self._reading or self._stopped or self._holding or self.direction.paused):
            self.source.watch_reading(self._readable)
            self._reading = True

    def _unwatch_source(self) -> None:
        if self._reading:
            self.source.watch_reading(None)
            self._reading = False

    def _watch_sink(self) -> None:
        self._unwatch_source()
        if not self._writing:
            self.sink.watch_writing(self._writable)
            self._writing = True

    def _settle(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
