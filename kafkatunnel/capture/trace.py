"""One proxied connection as a TCP conversation in a capture: its Kafka frames, redacted,
carried in synthetic IP/TCP segments with consistent sequence numbers.

Requests are recorded as the client sent them, responses as the client received them (after
rewriting), so a recording shows exactly what the client saw. Sans-I/O: chunks in, IP
packets out; the recorder adds timestamps and writes them.
"""

from __future__ import annotations

from collections.abc import Iterable

from kafkatunnel.capture.packets import ACK, FIN, MAX_SEGMENT, PSH, SYN, ip_tcp_segment
from kafkatunnel.capture.redact import redact_request, redact_response
from kafkatunnel.protocol.errors import ProtocolError
from kafkatunnel.protocol.framing import DEFAULT_MAX_FRAME_SIZE, FrameDecoder
from kafkatunnel.protocol.headers import expects_response, parse_request_header

Address = tuple[str, int]
CLIENT_ISN = 1_000
SERVER_ISN = 5_000_000


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
        self._requests = FrameDecoder(max_frame_size)
        self._responses = FrameDecoder(max_frame_size)
        # correlation id -> (api key, version); None: a request this trace did not keep
        self._pending: dict[int, tuple[int, int] | None] = {}
        self._client_seq = CLIENT_ISN + 1
        self._server_seq = SERVER_ISN + 1
        self.broken: str | None = None  # why this trace stopped following the stream
        self.frames = 0
        self.skipped = 0  # frames not written: unknown requests and their answers

    def opened(self) -> list[bytes]:
        """The handshake, so a reader sees the connection from its start."""
        return [
            ip_tcp_segment(self.client, self.server, CLIENT_ISN, 0, SYN, b""),
            ip_tcp_segment(self.server, self.client, SERVER_ISN, CLIENT_ISN + 1, SYN | ACK, b""),
            ip_tcp_segment(self.client, self.server, CLIENT_ISN + 1, SERVER_ISN + 1, ACK, b""),
        ]

    def from_client(self, chunks: Iterable[bytes | memoryview]) -> list[bytes]:
        frames = self._frames(self._requests, chunks)
        out: list[bytes] = []
        for whole in frames:
            try:
                header = parse_request_header(whole)
                if header.body_offset is None:
                    # Not a request this tunnel knows: perhaps a raw SASL token (SaslHandshake
                    # v0 is followed by unframed tokens, a PLAIN password among them). Its
                    # bytes may be anything, so neither it nor its answer is written.
                    self._pending[header.correlation_id] = None
                    self.skipped += 1
                    continue
                if expects_response(whole, header):
                    self._pending[header.correlation_id] = (header.api_key, header.api_version)
                kept = redact_request(whole, header, self.payloads)
            except ProtocolError as error:
                self.broken = f"a request could not be read: {error}"
                return out
            out.extend(self._segments(kept, to_server=True))
        return out

    def to_client(self, chunks: Iterable[bytes | memoryview]) -> list[bytes]:
        frames = self._frames(self._responses, chunks)
        out: list[bytes] = []
        for whole in frames:
            correlation = int.from_bytes(whole[4:8], "big", signed=True)
            if correlation not in self._pending:
                # An answer to no request seen: keep its correlation id only (fail closed).
                kept = (4).to_bytes(4, "big") + whole[4:8]
                out.extend(self._segments(kept, to_server=False))
                continue
            api = self._pending.pop(correlation)
            if api is None:
                self.skipped += 1
                continue
            kept = redact_response(whole, api[0], api[1], self.payloads)
            out.extend(self._segments(kept, to_server=False))
        return out

    def closed(self) -> list[bytes]:
        client, server = self._client_seq, self._server_seq
        return [
            ip_tcp_segment(self.client, self.server, client, server, FIN | ACK, b""),
            ip_tcp_segment(self.server, self.client, server, client + 1, FIN | ACK, b""),
            ip_tcp_segment(self.client, self.server, client + 1, server + 1, ACK, b""),
        ]

    def _frames(self, decoder: FrameDecoder, chunks: Iterable[bytes | memoryview]) -> list[bytes]:
        if self.broken is not None:
            return []
        frames: list[bytes] = []
        try:
            for chunk in chunks:
                frames.extend(decoder.feed(chunk))
        except ProtocolError as error:
            self.broken = str(error)
        self.frames += len(frames)
        return frames

    def _segments(self, data: bytes, to_server: bool) -> list[bytes]:
        out = []
        for start in range(0, len(data), MAX_SEGMENT):
            piece = data[start : start + MAX_SEGMENT]
            if to_server:
                seq, ack = self._client_seq, self._server_seq
                out.append(ip_tcp_segment(self.client, self.server, seq, ack, PSH | ACK, piece))
                self._client_seq += len(piece)
            else:
                seq, ack = self._server_seq, self._client_seq
                out.append(ip_tcp_segment(self.server, self.client, seq, ack, PSH | ACK, piece))
                self._server_seq += len(piece)
        return out
