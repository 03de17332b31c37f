"""Writing the tunnel's traffic to pcapng files in a directory, rotated by size.

Every file starts with a section header and one interface per tunnel listener (bootstrap and
each broker) whose description is JSON naming its node id, advertised address and tunnel
address: a reader ties each connection to its broker by the interface its packets are on.
Frames are written whole, so each file can be decoded on its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kafkatunnel import __version__
from kafkatunnel.capture import pcapng
from kafkatunnel.capture.trace import Address, ConnectionTrace

log = logging.getLogger("kafkatunnel.recorder")
DEFAULT_ROTATE_BYTES = 64 * 1024 * 1024
FLUSH_EVERY_NS = 1_000_000_000
FILE_PREFIX = "kafkatunnel-"


@dataclass(frozen=True, slots=True)
class Listener:
    """What a recording says about one tunnel listener."""

    node_id: int | None
    advertised: str
    tunnel: str
    mode: str = "rewrite"  # transparent: clients see the advertised names (the DNS shim's)

    def description(self, run: str) -> str:
        return json.dumps(
            {"kafkatunnel": 1, "run": run, "node_id": self.node_id,
             "advertised": self.advertised, "tunnel": self.tunnel, "mode": self.mode},
            separators=(",", ":"),
        )  # fmt: skip

    @property
    def name(self) -> str:
        return "bootstrap" if self.node_id is None else f"broker-{self.node_id}"


class Recorder:
    def __init__(
        self,
        directory: Path,
        rotate_bytes: int = DEFAULT_ROTATE_BYTES,
        payloads: bool = False,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.directory = directory
        self.rotate_bytes = rotate_bytes
        self.payloads = payloads
        self.clock = clock
        self.run = uuid.uuid4().hex[:12]
        self.listeners: list[Listener] = []
        self._index: dict[Listener, int] = {}
        self.files: list[Path] = []
        self.written = 0  # bytes, all files
        self._file: BinaryIO | None = None
        self._file_bytes = 0
        self._flushed = clock()
        self.failed: str | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self._rotate()

    def _rotate(self) -> None:
        if self._file is not None:
            self._file.close()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = self.directory / f"{FILE_PREFIX}{stamp}-{self.run}-{len(self.files):05d}.pcapng"
        self._file = open(path, "wb", buffering=1024 * 1024)  # noqa: SIM115 (kept open)
        self.files.append(path)
        self._file_bytes = 0
        comment = (
            f"kafkatunnel recording run {self.run}. Decode as Kafka: tshark -r FILE "
            "-d tcp.port==PORT,kafka for each tunnel port (interface descriptions name them)"
        )
        self._put(pcapng.section_header(comment, f"kafkatunnel {__version__}"))
        for listener in self.listeners:
            self._put(pcapng.interface_description(listener.name, listener.description(self.run)))

    def _put(self, block: bytes) -> None:
        if self._file is None:
            return
        try:
            self._file.write(block)
        except OSError as error:
            self._fail(error)
            return
        self._file_bytes += len(block)
        self.written += len(block)

    def _fail(self, error: OSError) -> None:
        """A full disk stops the recording, never the tunnel."""
        self.failed = f"recording stopped: {error}"
        log.error("%s (in %s)", self.failed, self.directory)
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
        self._file = None

    def interface(self, listener: Listener) -> int:
        index = self._index.get(listener)
        if index is None:
            index = self._index[listener] = len(self.listeners)
            self.listeners.append(listener)
            self._put(pcapng.interface_description(listener.name, listener.description(self.run)))
        return index

    def write(self, interface: int, packets: list[bytes]) -> None:
        if not packets or self._file is None:
            return
        if self._file_bytes >= self.rotate_bytes:
            try:
                self._rotate()
            except OSError as error:
                self._fail(error)
                return
        now = self.clock()
        for packet in packets:
            self._put(pcapng.enhanced_packet(interface, now, packet))
        if self._file is not None and now - self._flushed > FLUSH_EVERY_NS:
            try:  # a reader (or a crash) misses at most the last second
                self._file.flush()
            except OSError as error:
                self._fail(error)
            self._flushed = now

    def connection(self, listener: Listener, client: Address, server: Address) -> Recording:
        trace = ConnectionTrace(client, server, self.payloads)
        return Recording(self, self.interface(listener), trace)

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
                os.fsync(self._file.fileno())
            except OSError as error:
                self._fail(error)
            if self._file is not None:
                self._file.close()
            self._file = None


class Recording:
    """One connection's part of a recording, fed by the proxy as bytes pass."""

    __slots__ = ("interface", "recorder", "trace")

    def __init__(self, recorder: Recorder, interface: int, trace: ConnectionTrace) -> None:
        self.recorder = recorder
        self.interface = interface
        self.trace = trace
        recorder.write(interface, trace.opened())

    def from_client(self, chunks: list[bytes | memoryview]) -> None:
        self.recorder.write(self.interface, self.trace.from_client(chunks))

    def to_client(self, chunks: list[bytes | memoryview]) -> None:
        self.recorder.write(self.interface, self.trace.to_client(chunks))

    def unread_from_client(self, count: int) -> None:
        self.recorder.write(self.interface, self.trace.unread_from_client(count))

    def unread_to_client(self, count: int) -> None:
        self.recorder.write(self.interface, self.trace.unread_to_client(count))

    def closed(self) -> None:
        self.recorder.write(self.interface, self.trace.closed())
