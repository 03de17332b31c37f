"""One proxied connection as a TCP conversation in a capture: its Kafka frames, redacted,
carried in synthetic IP/TCP segments with consistent sequence numbers.

Requests are recorded as the client sent them, responses as the client received them (after
rewriting), so a recording shows exactly what the client saw. Sans-I/O: frames in, IP
packets out; the recorder adds timestamps and writes them.

A tunnel that reads Kafka hands over each frame as its Exchange passed it on, in parts:
record data it spliced (never read) is a count of bytes, and the walk that found it says
where it lies, so the frame is written with its record sets empty, as it would be had the
recording read them (see redact). A transparent tunnel's bytes are cut into frames here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from kafkatunnel.capture.packets import ACK, FIN, MAX_SEGMENT, PSH, SYN, Flow
from kafkatunnel.capture.redact import redact_request, redact_response
from kafkatunnel.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    SIZE_PREFIX,
    FrameSizeError,
    MalformedMessage,
    Part,
    ProtocolError,
    ReadRequest,
    RecordSpans,
    expects_response,
    parse_request_header,
)

Address = tuple[str, int]
SASL_HANDSHAKE = 17
# After a SaslHandshake v0, the client's next frames are raw SASL tokens, answered by raw
# server tokens, none of them Kafka messages: how many each mechanism exchanges (KIP-43).
# Any other mechanism (GSSAPI: as many rounds as Kerberos takes) keeps the rest of the
# connection out of the recording: it cannot tell where the tokens end.
RAW_TOKENS = {"PLAIN": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2, "OAUTHBEARER": 1}
UNTIL_THE_END = sys.maxsize
CLIENT_ISN = 1_000
SERVER_ISN = 5_000_000


Frame = bytes | list[Part]  # whole, or in parts when some record data passed unread


class SeenFrames:
    """One direction of a connection cut into frames from the bytes a recording saw of it
    (a transparent tunnel's: no Exchange frames them)."""

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self._prefix = bytearray()  # a size prefix split between reads
        self._pieces: list[bytes] = []  # read of the current frame
        self._missing = -1  # bytes of the current frame not seen yet; -1: its size unknown

    def feed(self, data: bytes, frames: list[bytes]) -> None:
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
                        frames.append(data[pos : pos + SIZE_PREFIX + size])
                        pos += SIZE_PREFIX + size
                        self._missing = -1
                        continue
                    pos += SIZE_PREFIX
                self._pieces.append(prefix)
            take = min(self._missing, end - pos)
            if take:
                self._pieces.append(data[pos : pos + take])
                pos += take
                self._missing -= take
            if not self._missing:
                frames.append(b"".join(self._pieces))
                self._pieces.clear()
                self._missing = -1

    def _size(self, prefix: bytes) -> int:
        """Start the frame whose size prefix this is."""
        size = int.from_bytes(prefix, "big", signed=True)
        if size < 0 or size > self.max_frame_size:
            raise FrameSizeError(f"frame size {size} is outside 0 to {self.max_frame_size}")
        self._missing = size
        return size


def _frame(parts: list[Part]) -> Frame:
    """A frame handed over in parts: whole bytes unless some of it passed unread."""
    first = parts[0]
    if len(parts) == 1 and isinstance(first, bytes):
        return first
    for part in parts:
        if part.__class__ is int:
            return parts
    return b"".join(parts)  # type: ignore[arg-type]


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
        self._raw_requests = 0  # client frames still to come that are raw SASL tokens
        self._raw_responses = 0  # and server frames, once the handshake's answer passed
        self._handshake: tuple[int, int] | None = None  # its correlation id, token count

    def opened(self) -> list[bytes]:
        """The handshake, so a reader sees the connection from its start."""
        return [
            self._to_server.segment(CLIENT_ISN, 0, SYN, b""),
            self._to_client.segment(SERVER_ISN, CLIENT_ISN + 1, SYN | ACK, b""),
            self._to_server.segment(CLIENT_ISN + 1, SERVER_ISN + 1, ACK, b""),
        ]

    def from_client(self, chunks: Iterable[bytes | memoryview]) -> list[bytes]:
        """Bytes the client sent (a transparent tunnel's, read whole)."""
        out: list[bytes] = []
        for frame in self._frames(self._requests, chunks):
            out += self._request_seen(frame, None, None)
        return out

    def to_client(self, chunks: Iterable[bytes | memoryview]) -> list[bytes]:
        """Bytes the client received (a transparent tunnel's, read whole)."""
        out: list[bytes] = []
        for frame in self._frames(self._responses, chunks):
            out += self._response_seen(frame, None)
        return out

    def request(
        self, parts: list[Part], records: RecordSpans | None, request: ReadRequest | None
    ) -> list[bytes]:
        """A request frame as the tunnel's Exchange passed it on: its parts, where its walk
        found record data, its header as the Exchange read it (see FrameSeen)."""
        if self.broken is not None:
            return []
        self.frames += 1
        return self._request_seen(_frame(parts), records, request)

    def response(self, parts: list[Part], records: RecordSpans | None) -> list[bytes]:
        """A response frame as the tunnel's Exchange passed it on (see request)."""
        if self.broken is not None:
            return []
        self.frames += 1
        return self._response_seen(_frame(parts), records)

    def _request_seen(
        self, frame: Frame, records: RecordSpans | None, request: ReadRequest | None
    ) -> list[bytes]:
        if self._raw_requests:  # a raw SASL token: never written, whatever it looks like
            self._raw_requests -= 1
            self.skipped += 1
            return []
        try:
            if request is not None:
                header, wanted = request
            else:
                head = frame if isinstance(frame, bytes) else frame[0]
                if isinstance(head, int):
                    raise MalformedMessage("a request began with bytes that passed unread")
                head = bytes(head)
                header = parse_request_header(head)
                wanted = header.body_offset is not None and expects_response(head, header)
            if header.body_offset is None:
                # Not a request this tunnel knows: perhaps a raw SASL token (SaslHandshake
                # v0 is followed by unframed tokens, a PLAIN password among them). Its bytes
                # may be anything, so neither it nor its answer is written.
                self._pending[header.correlation_id] = None
                self.skipped += 1
                return []
            if wanted:
                self._pending[header.correlation_id] = (header.api_key, header.api_version)
            if (header.api_key, header.api_version) == (SASL_HANDSHAKE, 0):
                tokens = RAW_TOKENS.get(_mechanism(frame, header.body_offset), UNTIL_THE_END)
                self._raw_requests = tokens
                self._handshake = (header.correlation_id, tokens)
            kept = redact_request(frame, header, self.payloads, records)
        except ProtocolError as error:
            self.broken = f"a request could not be read: {error}"
            return []
        return self._segments(kept, to_server=True)

    def _response_seen(self, frame: Frame, records: RecordSpans | None) -> list[bytes]:
        if self._raw_responses:
            self._raw_responses -= 1
            self.skipped += 1
            return []
        head = frame if isinstance(frame, bytes) else frame[0]
        if isinstance(head, int) or len(head) < SIZE_PREFIX + 4:
            self.broken = "a response too short for a correlation id, or unread at its head"
            return []
        correlation = int.from_bytes(head[4:8], "big", signed=True)
        if correlation not in self._pending:
            # An answer to no request seen: keep its correlation id only (fail closed).
            return self._segments((4).to_bytes(4, "big") + bytes(head[4:8]), to_server=False)
        api = self._pending.pop(correlation)
        if self._handshake is not None and self._handshake[0] == correlation:
            self._raw_responses = self._handshake[1]  # the server's tokens come next
            self._handshake = None
        if api is None:
            self.skipped += 1
            return []
        kept = redact_response(frame, api[0], api[1], self.payloads, records)
        return self._segments(kept, to_server=False)

    def closed(self) -> list[bytes]:
        client, server = self._client_seq, self._server_seq
        return [
            self._to_server.segment(client, server, FIN | ACK, b""),
            self._to_client.segment(server, client + 1, FIN | ACK, b""),
            self._to_server.segment(client + 1, server + 1, ACK, b""),
        ]

    def _frames(self, seen: SeenFrames, chunks: Iterable[bytes | memoryview]) -> list[bytes]:
        if self.broken is not None:
            return []
        frames: list[bytes] = []
        try:
            data = b"".join(chunks)  # the relay's chunks of one read (no copy when one)
            if data:
                seen.feed(data, frames)
        except ProtocolError as error:
            self.broken = str(error)
        self.frames += len(frames)
        return frames

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


def _mechanism(frame: Frame, body: int) -> str:
    """The mechanism a SaslHandshake request names ('' when it cannot be read)."""
    head = frame if isinstance(frame, bytes) else frame[0]
    if isinstance(head, int) or len(head) < body + 2:
        return ""
    length = int.from_bytes(head[body : body + 2], "big", signed=True)
    return bytes(head[body + 2 : body + 2 + max(length, 0)]).decode(errors="replace")
