"""Capping ApiVersions answers, so a client never picks a version the rewriter cannot parse.

A broker newer than the tunnel would otherwise let the client choose, say, Metadata v14;
the tunnel could not rewrite the answer, and the client would either see an unreachable
address or lose the connection. Clamping each rewritten API's advertised range to what the
rewriter knows makes the client negotiate down instead.
"""

from __future__ import annotations

import struct

from kio.schema.index import api_key_map

from kafkatunnel.protocol import wire
from kafkatunnel.protocol.errors import ProtocolError
from kafkatunnel.protocol.framing import SIZE_PREFIX, frame
from kafkatunnel.protocol.schema import known_versions

_ENTRY = struct.Struct(">hhh")
UNKNOWN_APIS = -1  # the key of caps for every API kio does not know (an API key is 0 or more)


def readable_caps() -> dict[int, range]:
    """Every API's versions that this layer can read, for a tunnel that records.

    A recording leaves out a request it cannot read (its bytes could be a raw SASL token, a
    PLAIN password among them), so a client that picked a version newer than the schemas
    here, as Kafka 4.4's clients pick StreamsGroupHeartbeat v1 and TxnOffsetCommit v6,
    would leave verify nothing to judge. Capped, the client negotiates down to a version the
    broker also serves.
    """
    return {key: known_versions(key) for key in api_key_map}


def narrowest(*caps: dict[int, range]) -> dict[int, range]:
    """Caps that hold to each of `caps`: for an API several cap, the versions all allow."""
    out: dict[int, range] = {}
    for each in caps:
        for key, allowed in each.items():
            was = out.get(key)
            out[key] = (
                allowed
                if was is None
                else range(max(was.start, allowed.start), min(was.stop, allowed.stop))
            )
    return out


def cap_api_versions(frame_bytes: bytes, api_version: int, caps: dict[int, range]) -> bytes:
    """`frame_bytes` (an ApiVersions response) with each API in `caps` clamped to its range,
    and without top-level tagged fields that only restate their defaults (DEFAULT_TAGS).

    An API whose advertised range does not overlap its cap is removed: the client then
    treats it as unsupported rather than using a version that would break the tunnel.
    caps[UNKNOWN_APIS], when there, is the cap of every API kio does not know (range(0):
    left out).
    Returns the same object when nothing needed changing.
    """
    unknown = caps.get(UNKNOWN_APIS)
    buf = frame_bytes
    pos = SIZE_PREFIX + 4  # ApiVersions always answers with response header v0
    error_code, pos = wire.read_int16(buf, pos)
    if error_code != 0:
        # An error answer (typically UNSUPPORTED_VERSION, in a layout brokers disagree on)
        # only tells the client which ApiVersions version to retry with: nothing to cap.
        return frame_bytes
    compact = api_version >= 3
    array_start = pos
    if compact:
        count, pos = wire.read_uvarint(buf, pos)
        count -= 1
    else:
        count, pos = wire.read_int32(buf, pos)
    kept: list[bytes] = []
    changed = False
    for _ in range(max(count, 0)):
        entry_start = pos
        wire.need(buf, pos, _ENTRY.size, "an ApiVersions entry")
        api_key, low, high = _ENTRY.unpack_from(buf, pos)
        pos += _ENTRY.size
        tail_start = pos
        if compact:
            pos = wire.skip_tagged_fields(buf, pos)
        allowed = caps.get(api_key, unknown if api_key not in api_key_map else None)
        if allowed is None or (allowed.start <= low and high < allowed.stop):
            kept.append(buf[entry_start:pos])
            continue
        changed = True
        new_low, new_high = max(low, allowed.start), min(high, allowed.stop - 1)
        if new_low <= new_high:
            kept.append(_ENTRY.pack(api_key, new_low, new_high) + buf[tail_start:pos])
    array_end = pos
    tail = buf[array_end:]
    if compact:  # throttle_time_ms, then the answer's own tagged fields
        wire.need(buf, array_end, 4, "ApiVersions throttle_time_ms")
        pruned = _without_defaults(buf, array_end + 4)
        if pruned is not None:
            tail = buf[array_end : array_end + 4] + pruned
            changed = True
    if not changed:
        return frame_bytes
    length = wire.write_uvarint(len(kept) + 1) if compact else len(kept).to_bytes(4, "big")
    body = buf[SIZE_PREFIX:array_start] + length + b"".join(kept) + tail
    return frame(body)


# The answer's tagged fields (ApiVersionsResponse.json, v3+) and the bytes of their default
# values: SupportedFeatures [], FinalizedFeaturesEpoch -1, FinalizedFeatures [],
# ZkMigrationReady false. A tagged field that is absent has its default, so dropping these
# changes nothing for a client; Apache Kafka's brokers never write them. Some brokers write
# all four, and librdkafka before 2.2.0 (Debian 12's kcat has 2.0.2) skips each tagged field
# one byte short (confluentinc/librdkafka#4278), so several of them end its ApiVersions
# parse in "Read underflow" and it never connects.
DEFAULT_TAGS = {0: b"\x01", 1: b"\xff" * 8, 2: b"\x01", 3: b"\x00"}


def _without_defaults(buf: bytes, pos: int) -> bytes | None:
    """The tagged-field section at pos (to the end of buf) without fields that hold their
    default value, or None when there are none to drop."""
    fields = list(wire.tagged_fields(buf, pos))
    kept = [f for f in fields if DEFAULT_TAGS.get(f.tag) != buf[f.data : f.end]]
    if len(kept) == len(fields):
        return None
    end = fields[-1].end
    return wire.write_uvarint(len(kept)) + b"".join(buf[f.start : f.end] for f in kept) + buf[end:]


API_VERSIONS, REBOOTSTRAP_REQUIRED = 18, 129
NODE_CHECKED_FROM = 5  # KIP-1242: ApiVersions names the node the client meant to reach


def misdirected_to(request: bytes, response: bytes) -> int | None:
    """The broker an ApiVersions exchange shows the client did NOT reach: the node its
    request named (KIP-1242, v5+), when the answer is REBOOTSTRAP_REQUIRED, the error a
    broker gives a client that meant another node. None otherwise, or when unreadable.

    Read by hand from Kafka's own definition (ApiVersionsRequest.json, v5): after the
    flexible request header, ClientSoftwareName and ClientSoftwareVersion (compact
    strings), ClusterId (compact nullable string), NodeId (int32). The answer's header is
    v0 whatever the version, and its body starts with ErrorCode.
    """
    try:
        api_key, api_version, _ = struct.unpack_from(">hhi", request, SIZE_PREFIX)
        if api_key != API_VERSIONS or api_version < NODE_CHECKED_FROM:
            return None
        error, _ = wire.read_int16(response, SIZE_PREFIX + 4)
        if error != REBOOTSTRAP_REQUIRED:
            return None
        pos = wire.skip_string(request, SIZE_PREFIX + 8, compact=False)  # the client id
        pos = wire.skip_tagged_fields(request, pos)
        for _ in range(3):  # software name and version, cluster id
            pos = wire.skip_string(request, pos, compact=True)
        node, _ = wire.read_int32(request, pos)
    except (ProtocolError, struct.error):
        return None
    return node if node >= 0 else None
