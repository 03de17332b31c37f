"""Rewriting every broker address in a response, so a client only sees tunnel addresses.

The walk follows the message's plan over the raw bytes. It records an edit for each host and
port it replaces, re-sizes any tagged field whose contents changed, and copies everything
else byte for byte: unknown tagged fields and record batches are never decoded. At the top
level it stops as soon as no address can follow (a Metadata response's topics come after
its brokers, so the cost grows with brokers, not partitions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kafkatunnel.protocol import wire
from kafkatunnel.protocol.errors import MalformedMessage, UnknownApiKey, UnsupportedVersion
from kafkatunnel.protocol.framing import SIZE_PREFIX
from kafkatunnel.protocol.headers import response_body_offset
from kafkatunnel.protocol.schema import (
    FIXED,
    FIXED_ARRAY,
    STRUCT,
    VARIABLE,
    VARIABLE_ARRAY,
    FieldPlan,
    StructPlan,
    known_versions,
    response_plan,
)

# Responses that carry broker addresses in some version (a test checks that no other API
# in Kafka's definitions does): Produce, Fetch, Metadata, FindCoordinator, DescribeQuorum,
# DescribeCluster, ShareFetch, ShareAcknowledge.
REWRITTEN_APIS = (0, 1, 3, 10, 55, 60, 78, 79)
# Responses with a host and port that are deliberately left alone: KRaft RPCs that only
# controllers send each other, and Kafka Streams group APIs, whose endpoints are those of
# the application's instances (interactive queries), not brokers.
NOT_REWRITTEN_WITH_ENDPOINTS = {
    52: "Vote (controllers only)",
    53: "BeginQuorumEpoch (controllers only)",
    54: "EndQuorumEpoch (controllers only)",
    59: "FetchSnapshot (controllers only)",
    82: "UpdateRaftVoter (controllers only)",
    88: "StreamsGroupHeartbeat (application endpoints)",
    89: "StreamsGroupDescribe (application endpoints)",
}
# Produce and Fetch versions older than the oldest this layer parses carry no address; for
# every other rewritten API an unparseable old version might, and must not pass unchecked.
OLD_VERSIONS_CARRY_NO_ADDRESS = (0, 1)


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    node_id: int
    host: str
    port: int


Mapper = Callable[[BrokerAddress], tuple[str, int] | None]
"""Given an advertised broker address, the address clients should see (None: unchanged).
May raise UnknownBroker instead, to have the caller learn the answer's brokers first."""


class UnknownBroker(Exception):
    """Raised by a mapper for an address it has no tunnel address for yet. Not a protocol
    error: the caller learns every address the answer names (addresses_in), in node-id
    order, and rewrites again, so a known-brokers answer is walked once, not twice."""


@dataclass(frozen=True, slots=True)
class Rewritten:
    frame: bytes  # the response to send on; the very same object when nothing changed
    seen: tuple[BrokerAddress, ...]  # every broker address the response named
    changed: bool


def rewrite_caps() -> dict[int, range]:
    """The versions a client may use of each rewritten API: those this layer can rewrite
    (and, for Produce and Fetch, the older ones that carry no address)."""
    caps = {}
    for key in REWRITTEN_APIS:
        known = known_versions(key)
        start = 0 if key in OLD_VERSIONS_CARRY_NO_ADDRESS else known.start
        caps[key] = range(start, known.stop)
    return caps


def needs_rewrite(api_key: int, api_version: int) -> bool:
    """Whether a response of this API and version can name a broker.

    A rewritten API at a version newer than this layer knows raises UnsupportedVersion:
    passing it on could leak an address, so it must not pass silently.
    """
    if api_key not in REWRITTEN_APIS:
        return False
    if api_version < known_versions(api_key).start and api_key in OLD_VERSIONS_CARRY_NO_ADDRESS:
        return False
    return response_plan(api_key, api_version).has_addresses


def rewrite_response(
    frame_bytes: bytes, api_key: int, api_version: int, mapper: Mapper
) -> Rewritten:
    """Rewrite the broker addresses in one response frame (size prefix included)."""
    try:
        plan = response_plan(api_key, api_version)
    except (UnknownApiKey, UnsupportedVersion):
        if needs_rewrite(api_key, api_version):
            raise
        return Rewritten(frame_bytes, (), False)
    if not plan.has_addresses:
        return Rewritten(frame_bytes, (), False)
    walk = ByteWalk(frame_bytes, mapper)
    walk.struct(plan, response_body_offset(frame_bytes, api_key, api_version), None, top=True)
    seen = tuple(walk.seen)
    if not walk.edits:
        return Rewritten(frame_bytes, seen, False)
    return Rewritten(splice(frame_bytes, walk.edits), seen, True)


def addresses_in(frame_bytes: bytes, api_key: int, api_version: int) -> tuple[BrokerAddress, ...]:
    """Every broker address a response names, changing nothing."""
    return rewrite_response(frame_bytes, api_key, api_version, keep_address).seen


def keep_address(_address: BrokerAddress) -> None:
    """The mapper that changes nothing: for walking an answer only to see what it names."""
    return None


Edit = tuple[int, int, bytes]


def _pieces(buf: bytes, start: int, end: int, edits: list[Edit]) -> list[bytes | memoryview]:
    view = memoryview(buf)
    pieces: list[bytes | memoryview] = []
    cursor = start
    for edit_start, edit_end, replacement in edits:
        pieces.append(view[cursor:edit_start])
        pieces.append(replacement)
        cursor = edit_end
    pieces.append(view[cursor:end])
    return pieces


def _apply(buf: bytes, start: int, end: int, edits: list[Edit]) -> bytes:
    return b"".join(_pieces(buf, start, end, edits))


def splice(frame_bytes: bytes, edits: list[Edit]) -> bytes:
    """The frame with `edits` applied and its size prefix corrected, copied once."""
    pieces = _pieces(frame_bytes, SIZE_PREFIX, len(frame_bytes), edits)
    size = sum(len(piece) for piece in pieces)
    return b"".join([size.to_bytes(SIZE_PREFIX, "big"), *pieces])


class ByteWalk:
    """A walk over one message's bytes by its plan, noting addresses and collecting edits."""

    __slots__ = ("buf", "edits", "mapper", "seen")

    def __init__(self, buf: bytes, mapper: Mapper) -> None:
        self.buf = buf
        self.mapper = mapper
        self.edits: list[Edit] = []
        self.seen: list[BrokerAddress] = []

    def struct(self, plan: StructPlan, pos: int, node_id: int | None, top: bool = False) -> int:
        if plan.address is None and plan.node_field is None and not top:
            return self.skim(plan, pos, node_id)
        fields = plan.fields
        stop_early = top and not plan.tagged_addresses
        count = plan.addresses_until if stop_early else len(fields)
        address = plan.address
        host = port = None
        host_span = port_span = (0, 0)
        for index in range(count):
            field = fields[index]
            start = pos
            if index == plan.node_field:
                node_id, pos = wire.read_int32(self.buf, pos)
            elif address is not None and index == address.host:
                host, pos = wire.read_string(self.buf, pos, plan.flexible)
                host_span = (start, pos)
            elif address is not None and index == address.port:
                if field.kafka_type == "uint16":
                    port, pos = wire.read_uint16(self.buf, pos)
                else:
                    port, pos = wire.read_int32(self.buf, pos)
                port_span = (start, pos)
            else:
                pos = self.field(field, pos, node_id)
        if address is not None and host is not None and port is not None:
            self.address(node_id, host, host_span, port, port_span, plan)
        if stop_early:
            return pos
        if plan.flexible:
            pos = self.tagged(plan, pos, node_id)
        return pos

    def skim(self, plan: StructPlan, pos: int, node_id: int | None) -> int:
        """A struct with no address or node id of its own: fixed-size runs in one step."""
        buf = self.buf
        for step in plan.steps:
            if step.__class__ is int:
                pos += step
                if pos > len(buf):
                    raise MalformedMessage(f"{plan.name} runs past the end of the message")
            else:
                pos = self.field(step, pos, node_id)  # type: ignore[arg-type]
        if plan.flexible:
            pos = self.tagged(plan, pos, node_id)
        return pos

    def address(
        self,
        node_id: int | None,
        host: str,
        host_span: tuple[int, int],
        port: int,
        port_span: tuple[int, int],
        plan: StructPlan,
    ) -> None:
        if node_id is None or node_id < 0:
            return  # e.g. FindCoordinator's "no coordinator yet": node -1, nothing to map
        seen = BrokerAddress(node_id, host, port)
        self.seen.append(seen)
        target = self.mapper(seen)
        if target is None or target == (host, port):
            return
        new_host, new_port = target
        port_field = plan.fields[plan.address.port]  # type: ignore[union-attr]
        encode_port = wire.write_uint16 if port_field.kafka_type == "uint16" else wire.write_int32
        self.edits.append((*host_span, wire.write_string(new_host, plan.flexible)))
        self.edits.append((*port_span, encode_port(new_port)))

    def field(self, field: FieldPlan, pos: int, node_id: int | None) -> int:
        buf = self.buf
        kind = field.kind
        if kind is FIXED:
            wire.need(buf, pos, field.size, field.name)
            return pos + field.size
        if kind is VARIABLE:
            return self.variable(field, pos)
        count, pos = self.array_length(pos, field)
        if kind is FIXED_ARRAY:
            wire.need(buf, pos, count * field.size, field.name)
            return pos + count * field.size
        if kind is VARIABLE_ARRAY:
            for _ in range(count):
                pos = self.variable(field, pos)
            return pos
        sub = field.struct
        assert sub is not None
        if kind is STRUCT:  # count 0: a nullable struct that is null
            return self.struct(sub, pos, node_id) if count else pos
        for _ in range(count):
            pos = self.struct(sub, pos, node_id)
        return pos

    def array_length(self, pos: int, field: FieldPlan) -> tuple[int, int]:
        """The element count of an array (0 for null), or for a nullable struct its marker."""
        buf = self.buf
        if field.kind is STRUCT:
            if not field.nullable:
                return 1, pos
            wire.need(buf, pos, 1, field.name)
            marker = buf[pos]
            if marker not in (0xFF, 1):
                raise MalformedMessage(f"nullable struct {field.name} has marker {marker}")
            return (1 if marker == 1 else 0), pos + 1
        if field.compact:
            if pos < len(buf) and buf[pos] < 0x80:  # a one-byte varint, as almost always
                count, pos = buf[pos] - 1, pos + 1
            else:
                count, pos = wire.read_uvarint(buf, pos)
                count -= 1
        else:
            count, pos = wire.read_int32(buf, pos)
        if count < -1 or (count == -1 and not field.nullable):
            raise MalformedMessage(f"array {field.name} has length {count}")
        if count > len(buf) - pos:
            raise MalformedMessage(
                f"array {field.name} claims {count} elements with {len(buf) - pos} bytes left"
            )
        return max(count, 0), pos

    def variable(self, field: FieldPlan, pos: int) -> int:
        buf = self.buf
        if field.compact:
            if pos < len(buf) and buf[pos] < 0x80:  # a one-byte varint, as almost always
                length, pos = buf[pos] - 1, pos + 1
            else:
                length, pos = wire.read_uvarint(buf, pos)
                length -= 1
        elif field.kafka_type == "string":
            length, pos = wire.read_int16(buf, pos)
        else:
            length, pos = wire.read_int32(buf, pos)
        if length < -1 or (length == -1 and not field.nullable):
            raise MalformedMessage(f"{field.name} has length {length}")
        if length > 0:
            wire.need(buf, pos, length, field.name)
            pos += length
        return pos

    def tagged(self, plan: StructPlan, pos: int, node_id: int | None) -> int:
        buf = self.buf
        if pos < len(buf) and buf[pos] == 0:  # no tagged fields, as almost always
            return pos + 1
        count, pos = wire.read_uvarint(buf, pos)
        for _ in range(count):
            field_start = pos
            tag, pos = wire.read_uvarint(buf, pos)
            size, pos = wire.read_uvarint(buf, pos)
            wire.need(buf, pos, size, f"tagged field {tag}")
            end = pos + size
            field = plan.tagged.get(tag)
            if field is not None and field.struct is not None and field.struct.has_addresses:
                inner = ByteWalk(buf[:end], self.mapper)
                inner.seen = self.seen
                if inner.field(field, pos, node_id) != end:
                    raise MalformedMessage(f"tagged field {tag} ({field.name}) has trailing bytes")
                if inner.edits:
                    data = _apply(buf, pos, end, inner.edits)
                    encoded = wire.write_uvarint(tag) + wire.write_uvarint(len(data)) + data
                    self.edits.append((field_start, end, encoded))
            pos = end
        return pos
