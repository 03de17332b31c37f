"""From a capture file's bytes to Kafka calls: TCP reassembly per connection, frames per
direction, and each request paired with its response by correlation id.

A call whose request and response fall in different files of a rotated recording comes out
as two halves (a dangling request, an orphan response) that `pair_halves` joins once the
halves of all files are together.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from kafkatunnel.capture.packets import SYN, Capture, Segment
from kafkatunnel.capture.pcapng import Interface
from kafkatunnel.probe import own_client
from kafkatunnel.protocol import (
    FrameDecoder,
    ProtocolError,
    expects_response,
    known_versions,
    parse_request_header,
)
from kafkatunnel.verify.resolutions import DnsAnswer, TcpDnsStream, answers_in

# Requests and responses whose bodies verify reads: coordinator-scoped APIs (every kind of
# group's: classic, consumer (KIP-848), share (KIP-932: 76, 77, 90-92) and streams
# (KIP-1071: 88, 89); transactions'), answers that can name brokers, and answers only a
# partition's leader gives (Produce, Fetch and ListOffsets; of their requests only Fetch's,
# for its rack). Everything else is counted.
COORDINATOR_APIS = {8, 9, 11, 12, 13, 14, 15, 22, 24, 25, 26, 28, 42, 47, 65, 68, 69, 76, 77,
                    88, 89, 90, 91, 92}  # fmt: skip
ADDRESS_APIS = {0, 1, 3, 10, 55, 60, 78, 79}
KEPT_APIS = COORDINATOR_APIS | {3, 10, 60, 18}  # ApiVersions: KIP-1242's node check
KEPT_REQUESTS = KEPT_APIS | {1}
KEPT_RESPONSES = KEPT_APIS | ADDRESS_APIS | {2}
MAX_OUT_OF_ORDER = 256  # segments held waiting for a gap to fill before giving up on a flow
PRODUCE = 0
_FIXED_HEADER = struct.Struct(">hhi")  # a request's api key, api version, correlation id


class Conn(NamedTuple):
    """A client connection: where it went, and which broker that was when the recording says.
    (A named tuple: cheap to pickle, as Spark does with every event that names one.)"""

    key: str  # "run/client/server": unique across the recordings being verified
    client: str
    server: str  # the address the client connected to
    node: int | None  # the broker behind it (a kafkatunnel listener's node); None: unknown
    tunnel: bool  # recorded by kafkatunnel (client-facing answers must name tunnel addresses)
    advertised: str | None = None  # the broker address the listener forwards to
    tool: str | None = None  # the client id, when it is this tool's (kafkatunnel-doctor...)

    @property
    def run(self) -> str:
        """The recording the connection is in: a kafkatunnel run's id (all its rotated
        files), or a plain capture's file; the first part of the key."""
        return self.key.rsplit("/", 2)[0]


@dataclass(slots=True)
class Call:
    conn: Conn
    api_key: int
    api_version: int
    correlation_id: int
    request_ts: int
    request: bytes | None  # the whole request frame, kept for APIs verify reads
    response_ts: int | None = None
    response: bytes | None = None  # the whole response frame, likewise


@dataclass(frozen=True, slots=True)
class Orphan:
    """A response whose request is not in this file."""

    conn: Conn
    correlation_id: int
    ts: int
    frame: bytes


@dataclass
class FileSummary:
    source: str
    frames: int = 0
    calls: int = 0
    tunnel: bool = False
    unreadable: bool = False  # not a capture at all
    listeners: list[dict[str, object]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    servers: set[str] = field(default_factory=set)  # addresses plain connections went to
    dns: list[DnsAnswer] = field(default_factory=list)  # DNS answers the capture holds
    cut_short: int | None = None  # the byte offset where a file cut short ends


def listener_of(interface: Interface) -> dict[str, object] | None:
    """The kafkatunnel listener an interface stands for, from its JSON description."""
    if not interface.description.startswith("{"):
        return None
    try:
        found = json.loads(interface.description)
    except ValueError:
        return None
    return found if isinstance(found, dict) and found.get("kafkatunnel") == 1 else None


def looks_like_request(payload: bytes | memoryview) -> bool:
    """Whether bytes start like a request frame (a response's correlation id can pass for
    a Produce header, so API key 0 is not taken as evidence)."""
    if len(payload) < 14:
        return False
    api_key = int.from_bytes(payload[4:6], "big", signed=True)
    version = int.from_bytes(payload[6:8], "big", signed=True)
    client_id = int.from_bytes(payload[12:14], "big", signed=True)
    size = int.from_bytes(payload[0:4], "big", signed=True)
    if api_key <= 0 or client_id < -1 or client_id > size:
        return False
    try:
        return version in known_versions(api_key)
    except ProtocolError:
        return False


class _Direction:
    __slots__ = ("broken", "decoder", "held", "next_seq", "sender")

    def __init__(self, sender: str) -> None:
        self.sender = sender  # client or server
        self.next_seq: int | None = None
        self.held: dict[int, bytes] = {}
        self.decoder = FrameDecoder()
        self.broken: str | None = None

    def bytes_in_order(self, segment: Segment) -> list[bytes | memoryview]:
        """This segment's new bytes, and any held ones it makes contiguous."""
        payload = segment.payload
        if segment.flags & SYN:
            self.next_seq = (segment.seq + 1) & 0xFFFFFFFF
            return []
        if not payload or self.broken is not None:
            return []
        if self.next_seq is None:
            self.next_seq = segment.seq
        offset = (segment.seq - self.next_seq) & 0xFFFFFFFF
        if offset >= 0x80000000:  # starts before what we have: a retransmission, maybe longer
            overlap = (self.next_seq - segment.seq) & 0xFFFFFFFF
            if overlap >= len(payload):
                return []
            payload, offset = payload[overlap:], 0
        if offset > 0:
            if len(self.held) >= MAX_OUT_OF_ORDER:
                self.broken = "a gap in the TCP stream (a segment was not captured)"
                return []
            self.held[segment.seq] = bytes(payload)
            return []
        out: list[bytes | memoryview] = [payload]
        self.next_seq = (self.next_seq + len(payload)) & 0xFFFFFFFF
        while self.next_seq in self.held:
            data = self.held.pop(self.next_seq)
            out.append(data)
            self.next_seq = (self.next_seq + len(data)) & 0xFFFFFFFF
        return out

    def unread(self) -> str | None:
        """Why bytes of this direction were left unread, if some were: a stream not Kafka's,
        or a gap that held the segments after it (a capture that dropped a packet)."""
        if self.broken is not None or not self.held:
            return self.broken
        after = sum(len(data) for data in self.held.values())
        return (
            f"a segment from the {self.sender} was not captured, so the {after} bytes captured "
            "after it were not read (the capture dropped packets, as tcpdump reports when it "
            "stops: capture with a larger buffer, e.g. tcpdump -B 32768)"
        )

    def frames(self, chunks: list[bytes | memoryview]) -> list[bytes]:
        if len(chunks) == 1 and not self.decoder.buffered:
            whole = chunks[0]  # a segment holding exactly one frame, as recordings write them
            size = len(whole) - 4
            if size >= 0 and int.from_bytes(whole[:4], "big", signed=True) == size:
                return [bytes(whole)]
        frames: list[bytes] = []
        for chunk in chunks:
            try:
                frames.extend(self.decoder.feed(chunk))
            except ProtocolError as error:
                self.broken = f"not a Kafka stream: {error}"
                break
        return frames


class _Flow:
    __slots__ = ("conn", "dns", "first_request", "pending", "requests", "responses")

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.first_request = True
        self.requests = _Direction("client")
        self.responses = _Direction("server")
        self.pending: dict[int, Call] = {}
        self.dns: TcpDnsStream | None = None  # a DNS-over-TCP connection, not Kafka


class FileDecoder:
    """Reads one capture file into calls, dangling requests and orphan responses."""

    def __init__(self, source: str, data: bytes | memoryview, log_frames: bool = False) -> None:
        self.source = source
        # (api key, correlation id, is a request) per frame, in order, when asked
        self.frame_log: list[tuple[int, int, bool]] | None = [] if log_frames else None
        self.capture = Capture(data)
        self.summary = FileSummary(source)
        self.calls: list[Call] = []
        self.orphans: list[Orphan] = []
        self._flows: dict[tuple[str, int, str, int], _Flow] = {}
        self._listeners: dict[int, dict[str, object] | None] = {}

    def run(self) -> FileDecoder:
        for segment in self.capture.segments():
            self._segment(segment)
        for ts, message in self.capture.dns:
            self.summary.dns.extend(answers_in(ts, message))
        if self.capture.cut_short_at is not None:
            self.summary.cut_short = self.capture.cut_short_at
            self.summary.problems.append(
                f"{self.source}: cut short at byte {self.capture.cut_short_at} of "
                f"{len(self.capture.data)} (a packet is missing its end: copied while still "
                "being written?); the packets before it were read"
            )
        for flow in self._flows.values():
            self.calls.extend(flow.pending.values())  # dangling: answered in a later file?
            for direction in (flow.requests, flow.responses):
                unread = direction.unread()
                if unread:
                    self.summary.problems.append(f"{flow.conn.key}: {unread}")
        self.summary.calls = len(self.calls)
        # every listener the recording describes, whether or not a client connected to it:
        # an address clients were told is the tunnel's even when none of them went there
        listeners = [x for x in self._listeners.values() if x is not None]
        for interface in self.capture.interfaces:
            described = listener_of(interface)
            if described is not None and described not in listeners:
                listeners.append(described)
        self.summary.listeners = listeners
        self.summary.tunnel = bool(self.summary.listeners)
        return self

    def _listener(self, interface: int) -> dict[str, object] | None:
        if interface not in self._listeners:
            interfaces = self.capture.interfaces
            found = listener_of(interfaces[interface]) if interface < len(interfaces) else None
            self._listeners[interface] = found
        return self._listeners[interface]

    def _flow(self, segment: Segment) -> tuple[_Flow, bool]:
        forward = (segment.src, segment.sport, segment.dst, segment.dport)
        flow = self._flows.get(forward)
        if flow is not None:
            return flow, True
        backward = (segment.dst, segment.dport, segment.src, segment.sport)
        flow = self._flows.get(backward)
        if flow is not None:
            return flow, False
        listener = self._listener(segment.interface)
        src, dst = f"{segment.src}:{segment.sport}", f"{segment.dst}:{segment.dport}"
        if listener is not None:
            to_server = src != listener.get("tunnel")
        elif segment.flags & SYN:
            to_server = not segment.flags & 0x10  # a SYN without ACK comes from the client
        elif looks_like_request(segment.payload):
            to_server = True  # Kafka clients speak first
        else:
            to_server = segment.dport <= segment.sport  # the service port is the lower one
        client, server = (src, dst) if to_server else (dst, src)
        node = listener.get("node_id") if listener is not None else None
        scope = listener.get("run") if listener is not None else self.source
        conn = Conn(
            key=f"{scope}/{client}/{server}",
            client=client,
            server=server,
            node=node if isinstance(node, int) else None,
            tunnel=listener is not None,
            advertised=str(listener["advertised"]) if listener is not None else None,
        )
        flow = _Flow(conn)
        if listener is None and server.endswith(":53"):
            flow.dns = TcpDnsStream()
        elif listener is None:
            self.summary.servers.add(server)
        self._flows[forward if to_server else backward] = flow
        return flow, to_server

    def _segment(self, segment: Segment) -> None:
        flow, to_server = self._flow(segment)
        direction = flow.requests if to_server else flow.responses
        chunks = direction.bytes_in_order(segment)
        if not chunks:
            return
        if flow.dns is not None:
            if not to_server:
                for chunk in chunks:
                    for message in flow.dns.feed(chunk):
                        self.summary.dns.extend(answers_in(segment.timestamp_ns, message))
            return
        frames = direction.frames(chunks)
        self.summary.frames += len(frames)
        if to_server:
            for whole in frames:
                self._request(flow, whole, segment.timestamp_ns)
        else:
            for whole in frames:
                self._response(flow, whole, segment.timestamp_ns)

    def _request(self, flow: _Flow, whole: bytes, ts: int) -> None:
        # Most requests need only the three fixed fields; the whole header (its client id,
        # a Produce's acks) is read for a connection's first request and for Produce.
        if len(whole) >= 12:
            api_key, api_version, correlation = _FIXED_HEADER.unpack_from(whole, 4)
        else:
            api_key = api_version = correlation = -1
        if api_key == PRODUCE or api_key < 0 or api_version < 0 or flow.first_request:
            try:
                header = parse_request_header(whole)
                wanted = expects_response(whole, header)
            except ProtocolError as error:
                flow.requests.broken = f"a request could not be read: {error}"
                return
            if flow.first_request:
                flow.first_request = False
                tool = own_client(header.client_id)
                if tool is not None:
                    flow.conn = flow.conn._replace(tool=tool)
        else:
            wanted = True
        if self.frame_log is not None:
            self.frame_log.append((api_key, correlation, True))
        kept = whole if api_key in KEPT_REQUESTS else None
        call = Call(flow.conn, api_key, api_version, correlation, ts, kept)
        if wanted:  # acks=0 Produce requests are answered by nothing and verify nothing
            flow.pending[correlation] = call

    def _response(self, flow: _Flow, whole: bytes, ts: int) -> None:
        if len(whole) < 8:
            flow.responses.broken = "a response shorter than its correlation id"
            return
        correlation = int.from_bytes(whole[4:8], "big", signed=True)
        call = flow.pending.pop(correlation, None)
        if self.frame_log is not None:
            self.frame_log.append((-1 if call is None else call.api_key, correlation, False))
        if call is None:
            self.orphans.append(Orphan(flow.conn, correlation, ts, whole))
            return
        call.response_ts = ts
        if call.api_key in KEPT_RESPONSES:
            call.response = whole
        self.calls.append(call)


def pair_halves(halves: Iterable[Call | Orphan]) -> Iterator[Call]:
    """Join dangling requests and orphan responses of one connection (any order in)."""
    requests: dict[int, list[Call]] = {}
    orphans: list[Orphan] = []
    for half in halves:
        if isinstance(half, Orphan):
            orphans.append(half)
        else:
            requests.setdefault(half.correlation_id, []).append(half)
    for waiting in requests.values():
        waiting.sort(key=lambda c: c.request_ts)
    for orphan in sorted(orphans, key=lambda o: o.ts):
        candidates = requests.get(orphan.correlation_id, [])
        match = next((c for c in candidates if c.request_ts <= orphan.ts), None)
        if match is None:
            continue
        candidates.remove(match)
        match.response_ts = orphan.ts
        match.response = orphan.frame
        yield match
    for waiting in requests.values():
        yield from waiting  # never answered in the recordings


def is_dangling(call: Call) -> bool:
    return call.response_ts is None
