"""One proxied connection as a TCP conversation in a capture: its Kafka frames, redacted,
carried in synthetic IP/TCP segments with consistent sequence numbers.

Requests are recorded as the client sent them, responses as the client received them (after
rewriting), so a recording shows exactly what the client saw. Sans-I/O: chunks in, IP
packets out; the recorder adds timestamps and writes them.

Record data the relay spliced (it never entered Python) arrives as a count of bytes instead
of chunks: the frame it belongs to is written with its record sets empty, as it would be
had the recording read them (the relay's walk says where they lie; see redact).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from kafkatunnel.capture.packets import ACK, FIN, MAX_SEGMENT, PSH, SYN, Flow
from kafkatunnel.capture.redact import Part, Records, redact_request, redact_response
from kafkatunnel.protocol.errors import FrameSizeError, MalformedMessage, ProtocolError
from kafkatunnel.protocol.framing import DEFAULT_MAX_FRAME_SIZE, SIZE_PREFIX
from kafkatunnel.protocol.headers import RequestHeader, expects_response, parse_request_header

Address = tuple[str, int]
CLIENT_ISN = 1_000
SERVER_ISN = 5_000_000


Frame = bytes | list[Part]  # whole, or in parts when some record data passed unread
Spans = tuple[tuple[int, int], ...]  # where record data lies in a frame


# A walked request's header as the relay read it, and whether it is answered: a recording
# need not read it again.
Request = tuple[RequestHeader, bool]
_NOT_TOLD: tuple[None, None] = (None, None)


class Seen(NamedTuple):
    frame: Frame
    records: Records | None  # where the relay's walk found its record data, if it walked it
    request: Request | None  # a walked request's header, as the relay read it


class SeenFrames:
    """One direction of a connection cut into frames from what a recording saw of it: the
    bytes the relay read, and counts of bytes it passed unread."""

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self._prefix = bytearray()  # a size prefix split between reads
        self._pieces: list[bytes] = []  # read of the current frame, since its last unread run
        self._parts: list[Part] = []  # of the current frame, before _pieces
        self._missing = -1  # bytes of the current frame not seen yet; -1: its size unknown
        self._frame_start = 0  # stream offset of the current frame
        self._next_frame = 0
        self._told: dict[int, tuple[Records, Request | None]] = {}

    def records(self, start: int, spans: Spans, compact: bool, request: Request | None) -> None:
        """The frame at stream offset `start` has record data at `spans` (the relay's walk
        says so before it hands over the frame's last bytes)."""
        self._told[start] = ((spans, compact), request)

    def feed(self, data: bytes, frames: list[Seen]) -> None:
        """The next bytes of the stream, as the relay read them."""
        pos, end = 0, len(data)
        while pos < end:
            if self._missing < 0:
                if self._prefix or end - pos < SIZE_PREFIX:  # a size prefix cut by a read
                    take = min(SIZE_PREFIX - len(self._prefix), end - pos)
                    self._prefix += data[pos : pos + take]
                    pos += take
                    if len(self._prefix) < SIZE_PREFIX:
                        return
                    prefix = bytes(self._prefix)
                    self._prefix.clear()
                    self._size(prefix)
                else:
                    prefix = data[pos : pos + SIZE_PREFIX]
                    size = self._size(prefix)
                    if end - pos - SIZE_PREFIX >= size:  # the whole frame is here: one slice
                        frame, pos = data[pos : pos + SIZE_PREFIX + size], pos + SIZE_PREFIX + size
                        self._missing = -1
                        frames.append(Seen(frame, *self._told.pop(self._frame_start, _NOT_TOLD)))
                        continue
                    pos += SIZE_PREFIX
                self._pieces.append(prefix)
            take = min(self._missing, end - pos)
            if take:
                self._pieces.append(data[pos : pos + take])
                pos += take
                self._missing -= take
            if not self._missing:
                frames.append(self._finish())

    def unread(self, count: int) -> Seen | None:
        """`count` bytes of the current frame passed unread; the frame, if that ended it.
        The relay splices record data a pipe's worth at a time: runs in a row are one."""
        if count > self._missing:  # also: before a frame's size was seen
            raise MalformedMessage(f"{count} bytes passed unread outside a frame's body")
        parts = self._parts
        if self._pieces:
            parts.append(b"".join(self._pieces))
            self._pieces.clear()
            parts.append(count)
        elif parts and parts[-1].__class__ is int:
            parts[-1] += count
        else:
            parts.append(count)
        self._missing -= count
        return None if self._missing else self._finish()

    def _size(self, prefix: bytes) -> int:
        """Start the frame whose size prefix this is."""
        size = int.from_bytes(prefix, "big", signed=True)
        if size < 0 or size > self.max_frame_size:
            raise FrameSizeError(f"frame size {size} is outside 0 to {self.max_frame_size}")
        self._missing = size
        self._frame_start = self._next_frame
        self._next_frame += SIZE_PREFIX + size
        return size

    def _finish(self) -> Seen:
        read = b"".join(self._pieces)
        self._pieces.clear()
        self._missing = -1
        told = self._told.pop(self._frame_start, _NOT_TOLD)
        if not self._parts:
            return Seen(read, *told)
        parts, self._parts = self._parts, []
        if read:
            parts.append(read)
        return Seen(parts, *told)


class ConnectionTrace:
    def __init__(
        self,
        client: Address,
        server: Address,
        payloads: bool = False,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        self.client = client
        self.server = server
        self.payloads = payloads
        self._requests = SeenFrames(max_frame_size)
        self._responses = SeenFrames(max_frame_size)
        # correlation id -> (api key, version); None: a request this trace did not keep
        self._pending: dict[int, tuple[int, int] | None] = {}
        self._to_server = Flow(client, server)
        self._to_client = Flow(server, client)
        self._client_seq = CLIENT_ISN + 1
        self._server_seq = SERVER_ISN + 1
        self.broken: str | None = None  # why this trace stopped following the stream
        self.frames = 0
        self.skipped = 0  # frames not written: unknown requests and their answers

    def opened(self) -> list[bytes]:
        """The handshake, so a reader sees the connection from its start."""
        return [
            self._to_server.segment(CLIENT_ISN, 0, SYN, b""),
            self._to_client.segment(SERVER_ISN, CLIENT_ISN + 1, SYN | ACK, b""),
            self._to_server.segment(CLIENT_ISN + 1, SERVER_ISN + 1, ACK, b""),
        ]

    def from_client(self, chunks: Iterable[bytes | memoryview]) -> list[bytes]:
        return self._requests_seen(self._frames(self._requests, chunks))

    def unread_from_client(self, count: int) -> list[bytes]:
        """`count` bytes of record data went to the broker without being read."""
        frames = self._unread(self._requests, count)
        return self._requests_seen(frames) if frames else []

    def to_client(self, chunks: Iterable[bytes | memoryview]) -> list[bytes]:
        return self._responses_seen(self._frames(self._responses, chunks))

    def unread_to_client(self, count: int) -> list[bytes]:
        """`count` bytes of record data went to the client without being read."""
        frames = self._unread(self._responses, count)
        return self._responses_seen(frames) if frames else []

    def records_in_request(
        self, start: int, spans: Spans, compact: bool, request: Request | None = None
    ) -> None:
        """The relay walked the request at stream offset `start`: its records are at spans
        (and its header is `request`, when the relay tells it)."""
        self._requests.records(start, spans, compact, request)

    def records_in_response(
        self, start: int, spans: Spans, compact: bool, _request: Request | None = None
    ) -> None:
        self._responses.records(start, spans, compact, None)

    def _requests_seen(self, seen: list[Seen]) -> list[bytes]:
        out: list[bytes] = []
        for frame, records, request in seen:
            try:
                if request is not None:
                    header, wanted = request
                else:
                    head = frame if isinstance(frame, bytes) else frame[0]
                    if isinstance(head, int):
                        raise MalformedMessage("a request began with bytes that passed unread")
                    head = bytes(head)
                    header = parse_request_header(head)
                    if header.body_offset is None:
                        # Not a request this tunnel knows: perhaps a raw SASL token
                        # (SaslHandshake v0 is followed by unframed tokens, a PLAIN password
                        # among them). Its bytes may be anything, so neither it nor its
                        # answer is written.
                        self._pending[header.correlation_id] = None
                        self.skipped += 1
                        continue
                    wanted = expects_response(head, header)
                if wanted:
                    self._pending[header.correlation_id] = (header.api_key, header.api_version)
                kept = redact_request(frame, header, self.payloads, records)
            except ProtocolError as error:
                self.broken = f"a request could not be read: {error}"
                return out
            out.extend(self._segments(kept, to_server=True))
        return out

    def _responses_seen(self, seen: list[Seen]) -> list[bytes]:
        out: list[bytes] = []
        for frame, records, _ in seen:
            head = frame if isinstance(frame, bytes) else frame[0]
            if isinstance(head, int) or len(head) < SIZE_PREFIX + 4:
                self.broken = "a response too short for a correlation id, or unread at its head"
                return out
            correlation = int.from_bytes(head[4:8], "big", signed=True)
            if correlation not in self._pending:
                # An answer to no request seen: keep its correlation id only (fail closed).
                kept = (4).to_bytes(4, "big") + bytes(head[4:8])
                out.extend(self._segments(kept, to_server=False))
                continue
            api = self._pending.pop(correlation)
            if api is None:
                self.skipped += 1
                continue
            kept = redact_response(frame, api[0], api[1], self.payloads, records)
            out.extend(self._segments(kept, to_server=False))
        return out

    def closed(self) -> list[bytes]:
        client, server = self._client_seq, self._server_seq
        return [
            self._to_server.segment(client, server, FIN | ACK, b""),
            self._to_client.segment(server, client + 1, FIN | ACK, b""),
            self._to_server.segment(client + 1, server + 1, ACK, b""),
        ]

    def _frames(self, seen: SeenFrames, chunks: Iterable[bytes | memoryview]) -> list[Seen]:
        if self.broken is not None:
            return []
        frames: list[Seen] = []
        try:
            data = b"".join(chunks)  # the relay's chunks of one read (no copy when one)
            if data:
                seen.feed(data, frames)
        except ProtocolError as error:
            self.broken = str(error)
        self.frames += len(frames)
        return frames

    def _unread(self, seen: SeenFrames, count: int) -> list[Seen]:
        if self.broken is not None:
            return []
        try:
            frame = seen.unread(count)
        except ProtocolError as error:
            self.broken = str(error)
            return []
        if frame is None:
            return []
        self.frames += 1
        return [frame]

    def _segments(self, data: bytes, to_server: bool) -> list[bytes]:
        if to_server:
            flow, seq, ack = self._to_server, self._client_seq, self._server_seq
            self._client_seq += len(data)
        else:
            flow, seq, ack = self._to_client, self._server_seq, self._client_seq
            self._server_seq += len(data)
        if len(data) <= MAX_SEGMENT:
            return [flow.segment(seq, ack, PSH | ACK, data)] if data else []
        return [
            flow.segment(seq + start, ack, PSH | ACK, data[start : start + MAX_SEGMENT])
            for start in range(0, len(data), MAX_SEGMENT)
        ]
