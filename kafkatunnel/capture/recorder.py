"""Writing the tunnel's traffic to pcapng files in a directory, rotated by size.

Every file starts with a section header and one interface per tunnel listener (bootstrap and
each broker) whose description is JSON naming its node id, advertised address and tunnel
address: a reader ties each connection to its broker by the interface its packets are on.
Frames are written whole, so each file can be decoded on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kafkatunnel import __version__
from kafkatunnel.capture import pcapng
from kafkatunnel.capture.trace import Address, ConnectionTrace
from kafkatunnel.files import create_private, private_dir
from kafkatunnel.protocol import FramePassed, Part, ReadRequest, RecordSpans

log = logging.getLogger("kafkatunnel.recorder")
DEFAULT_ROTATE_BYTES = 64 * 1024 * 1024
DEFAULT_BACKLOG_BYTES = 256 * 1024 * 1024  # memory held for a disk that cannot keep up
FILE_PREFIX = "kafkatunnel-"


@dataclass(frozen=True, slots=True)
class Listener:
    """What a recording says about one tunnel listener."""

    node_id: int | None
    advertised: str
    tunnel: str
    mode: str = "rewrite"  # transparent: clients see the advertised names (the DNS shim's)
    # --isolate's suffix: the recording's group and transactional ids are the cluster's,
    # NAME.SUFFIX for a client's NAME
    isolate: str | None = None

    def description(self, run: str) -> str:
        described: dict[str, object] = {"kafkatunnel": 1, "run": run, "node_id": self.node_id,
                                        "advertised": self.advertised, "tunnel": self.tunnel,
                                        "mode": self.mode}  # fmt: skip
        if self.isolate is not None:
            described["isolate"] = self.isolate
        return json.dumps(described, separators=(",", ":"))

    @property
    def name(self) -> str:
        return "bootstrap" if self.node_id is None else f"broker-{self.node_id}"


_CLOSE = None
# To the writer: a file to open, blocks to write, an event to set once written, close.
_Command = Path | list[bytes] | threading.Event | None
HAND_OVER = 256 << 10  # bytes of blocks handed to the writer at once, at the most
HAND_OVER_AFTER = 0.1  # seconds a block waits for the writer, at the most
# Frames kept before their packets are built in one go (or HAND_OVER_AFTER after the first).
BUILD_BATCH = 64
# A frame to build packets for: its connection, whether it is a response, its parts, where
# its records lay, a request's header, and when it passed.
_Frame = tuple["Recording", bool, list[Part], RecordSpans | None, ReadRequest | None, int]


def _open_unbuffered(path: Path) -> BinaryIO:
    """A new recording file, 0600, never through a symlink (the writer closes it)."""
    return os.fdopen(create_private(path), "wb", buffering=0)


class Recorder:
    """The recording of one tunnel run. The relay's thread only builds blocks; a thread of
    the recorder's own writes them, so a slow or stalled disk never slows a connection.
    Blocks are handed over in batches (every HAND_OVER bytes, or HAND_OVER_AFTER seconds
    after the first): waking the writer thread for every packet cost more than the rest of
    recording it. A disk that fails (full) or falls more than `backlog_bytes` behind stops
    the recording, says why (status), and never touches a connection."""

    def __init__(
        self,
        directory: Path,
        rotate_bytes: int = DEFAULT_ROTATE_BYTES,
        payloads: bool = False,
        clock: Callable[[], int] = time.time_ns,
        backlog_bytes: int = DEFAULT_BACKLOG_BYTES,
        opener: Callable[[Path], BinaryIO] = _open_unbuffered,
    ) -> None:
        self.directory = directory
        self.rotate_bytes = rotate_bytes
        self.payloads = payloads
        self.clock = clock
        self.backlog_bytes = backlog_bytes
        self.run = uuid.uuid4().hex[:12]
        self.listeners: list[Listener] = []
        self._index: dict[Listener, int] = {}
        self.files: list[Path] = []
        self.failed: str | None = None
        self._pending: list[bytes] = []  # blocks not handed over yet
        self._frames: list[_Frame] = []  # frames whose packets are not built yet
        self._pending_bytes = 0
        self._queued = 0  # bytes of blocks made (relay thread only)
        self._handled = 0  # bytes the writer wrote or, once stopped, dropped (writer only)
        self.written = 0  # bytes the writer stored, all files (writer thread only)
        self._file_bytes = 0  # bytes made for the current file
        self._stopped = False  # no more blocks are made
        self._queue: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        private_dir(directory)
        self._writer = _Writer(self, opener)
        self._writer.start()
        self._rotate()

    @property
    def backlog(self) -> int:
        """Bytes made and not yet written."""
        return self._queued - self._handled

    def _rotate(self) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = self.directory / f"{FILE_PREFIX}{stamp}-{self.run}-{len(self.files):05d}.pcapng"
        self.files.append(path)
        self._send(path)
        self._file_bytes = 0
        comment = (
            f"kafkatunnel recording run {self.run}. Decode as Kafka: tshark -r FILE "
            "-d tcp.port==PORT,kafka for each tunnel port (interface descriptions name them)"
        )
        self._put(pcapng.section_header(comment, f"kafkatunnel {__version__}"))
        for listener in self.listeners:
            self._put(pcapng.interface_description(listener.name, listener.description(self.run)))

    def _put(self, block: bytes) -> None:
        if self._stopped:
            return
        if self.failed is not None:  # the writer failed: make no more
            self._stop()
            return
        if self._queued - self._handled > self.backlog_bytes:  # (backlog, inline: per frame)
            self.fail(
                f"the disk fell {self.backlog >> 20} MiB behind the traffic (is "
                f"{self.directory} on a slow or stalled disk?); record to a faster one"
            )
            return
        self._pending.append(block)
        self._pending_bytes += len(block)
        self._queued += len(block)
        self._file_bytes += len(block)
        if self._pending_bytes >= HAND_OVER:
            self._hand_over()
        elif len(self._pending) == 1:
            try:
                asyncio.get_running_loop().call_later(HAND_OVER_AFTER, self._hand_over)
            except RuntimeError:  # no event loop (a tool, a test): hand over at once
                self._hand_over()

    def _hand_over(self) -> None:
        if self._pending:
            self._queue.put(self._pending)
            self._pending = []
            self._pending_bytes = 0

    def _send(self, command: _Command) -> None:
        """A command for the writer, after the blocks made before it."""
        self._hand_over()
        self._queue.put(command)

    def fail(self, why: str) -> None:
        """Stop the recording, saying why; connections are not touched."""
        self.note_failure(why)
        self._frames.clear()
        self._stop()

    def note_failure(self, why: str) -> None:
        """Say why the recording stops (the writer's thread: the relay's thread, seeing it,
        makes no more blocks and tells the writer to close)."""
        if self.failed is None:
            self.failed = f"recording stopped: {why}"
            log.error("%s (in %s)", self.failed, self.directory)

    def _stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._send(_CLOSE)

    def interface(self, listener: Listener) -> int:
        index = self._index.get(listener)
        if index is None:
            index = self._index[listener] = len(self.listeners)
            self.listeners.append(listener)
            self._put(pcapng.interface_description(listener.name, listener.description(self.run)))
        return index

    def write(self, interface: int, packets: list[bytes]) -> None:
        """Packets of one connection, in order after every frame passed before them."""
        if not packets or self._stopped:
            return
        if self._frames:
            self.build()
        self._write(interface, packets, self.clock())

    def _write(self, interface: int, packets: list[bytes], now: int) -> None:
        if self._file_bytes >= self.rotate_bytes:
            self._rotate()
        for packet in packets:
            self._put(pcapng.enhanced_packet(interface, now, packet))

    def frame(
        self,
        recording: Recording,
        response: bool,
        parts: list[Part],
        records: RecordSpans | None,
        request: ReadRequest | None,
    ) -> None:
        """A frame that passed, its packets built later with others (BUILD_BATCH at a
        time, or HAND_OVER_AFTER after the first): a frame a megabyte of splicing after
        the last finds the trace's code and data gone from the CPU's caches; built in a
        row, the packets of many share one warming."""
        if self._stopped:
            return
        self._frames.append((recording, response, parts, records, request, self.clock()))
        if len(self._frames) >= BUILD_BATCH or self.payloads:  # (megabytes of records: now)
            self.build()
        elif len(self._frames) == 1:
            try:
                asyncio.get_running_loop().call_later(HAND_OVER_AFTER, self.build)
            except RuntimeError:  # no event loop (a tool, a test): build at once
                self.build()

    def build(self) -> None:
        """Build the packets of the frames kept so far, in the order they passed."""
        frames, self._frames = self._frames, []
        for recording, response, parts, records, request, now in frames:
            trace = recording.trace
            if response:
                packets = trace.response(parts, records)
            else:
                packets = trace.request(parts, records, request)
            if packets:
                self._write(recording.interface, packets, now)

    def connection(self, listener: Listener, client: Address, server: Address) -> Recording:
        trace = ConnectionTrace(client, server, self.payloads)
        return Recording(self, self.interface(listener), trace)

    def sync(self, timeout: float = 30.0) -> bool:
        """Wait until every block made so far is written (or the writer ended): False if
        that took longer than `timeout`."""
        done = threading.Event()
        self.build()
        self._send(done)  # the writer sets it once it has written what came before
        deadline = time.monotonic() + timeout
        while self._writer.is_alive():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if done.wait(min(left, 0.1)):  # or the writer ends without reaching it
                return True
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Write what is made, sync it to disk and close the file (up to `timeout`)."""
        self.build()
        self._stop()
        self._writer.join(timeout)
        if self._writer.is_alive():
            self.fail(f"the disk did not take the last {self.backlog >> 20} MiB in {timeout:g}s")


class _Writer(threading.Thread):
    """The thread that owns the recording's file: opens, writes, closes."""

    def __init__(self, recorder: Recorder, opener: Callable[[Path], BinaryIO]) -> None:
        super().__init__(name="kafkatunnel-recorder", daemon=True)
        self.recorder = recorder
        self.opener = opener
        self.file: BinaryIO | None = None

    def run(self) -> None:
        recorder = self.recorder
        while True:
            command = recorder._queue.get()
            try:
                if isinstance(command, list):
                    self._write(command)
                elif isinstance(command, Path):
                    self._close(sync=False)
                    if recorder.failed is None:
                        self.file = self.opener(command)
                elif isinstance(command, threading.Event):
                    command.set()
                else:
                    self._close(sync=True)
                    return
            except OSError as error:
                recorder.note_failure(str(error))
                self._close(sync=False)
                if isinstance(command, list):
                    recorder._handled += sum(map(len, command))

    def _write(self, blocks: list[bytes]) -> None:
        size = sum(map(len, blocks))
        if self.file is not None and self.recorder.failed is None:
            view = memoryview(b"".join(blocks))
            while view:
                view = view[self.file.write(view) or 0 :]
            self.recorder.written += size
        self.recorder._handled += size

    def _close(self, sync: bool) -> None:
        file, self.file = self.file, None
        if file is None:
            return
        try:
            if sync:
                os.fsync(file.fileno())
        except OSError as error:
            self.recorder.note_failure(str(error))
        finally:
            with contextlib.suppress(OSError):
                file.close()


class Recording:
    """One connection's part of a recording, fed by the proxy as bytes pass."""

    __slots__ = ("interface", "recorder", "trace")

    def __init__(self, recorder: Recorder, interface: int, trace: ConnectionTrace) -> None:
        self.recorder = recorder
        self.interface = interface
        self.trace = trace
        recorder.write(interface, trace.opened())

    def from_client(self, chunks: list[bytes | memoryview]) -> None:
        """Bytes the client sent, read whole (a transparent tunnel's)."""
        packets = self.trace.from_client(chunks)
        if packets:  # a read that ends no frame writes nothing
            self.recorder.write(self.interface, packets)

    def to_client(self, chunks: list[bytes | memoryview]) -> None:
        packets = self.trace.to_client(chunks)
        if packets:
            self.recorder.write(self.interface, packets)

    def requests(self, frames: Sequence[FramePassed]) -> None:
        """Requests as the tunnel's Exchange passed them on (see passage.FramePassed)."""
        for passed in frames:
            self.recorder.frame(self, False, *passed)

    def responses(self, frames: Sequence[FramePassed]) -> None:
        for parts, records, _ in frames:
            self.recorder.frame(self, True, parts, records, None)

    def closed(self) -> None:
        self.recorder.write(self.interface, self.trace.closed())
