"""Request and response headers.

Request header v1 is api_key, api_version, correlation_id, client_id (a legacy nullable
string, even in v2); v2 adds tagged fields. Flexible API versions use v2, others v1
(ControlledShutdown v0 uses v0, without client_id; ApiVersions is known at every version,
even one newer than kio's). A response header is the correlation id,
plus tagged fields (v1) for flexible versions, except ApiVersions which always answers with v0.
"""

from __future__ import annotations

import functools
import struct
from typing import NamedTuple

from kafkatunnel.protocol import wire
from kafkatunnel.protocol.errors import MalformedMessage, ProtocolError
from kafkatunnel.protocol.framing import SIZE_PREFIX
from kafkatunnel.protocol.schema import FIXED, is_flexible, response_plan

API_VERSIONS = 18
API_VERSIONS_FLEXIBLE = 3
CONTROLLED_SHUTDOWN = 7
PRODUCE = 0


class RequestHeader(NamedTuple):
    """(A named tuple: the relay makes one per request, a recording another.)"""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int | None  # where the body starts in the frame; None if the version is unknown


@functools.cache  # asked once per frame, of a handful of distinct (key, version) pairs
def request_header_version(api_key: int, api_version: int) -> int:
    if api_key == CONTROLLED_SHUTDOWN and api_version == 0:
        return 0
    if api_key == API_VERSIONS and api_version >= API_VERSIONS_FLEXIBLE:
        # a client's first request, sent before it knows what the broker reads, at versions
        # newer than kio's (v5, KIP-1242, names the node meant): flexible from v3 on, as
        # ApiVersionsRequest.json says ("flexibleVersions": "3+"), at every later version
        return 2
    return 2 if is_flexible(api_key, api_version) else 1


@functools.cache
def response_header_version(api_key: int, api_version: int) -> int:
    if api_key == API_VERSIONS:
        return 0
    from kio.static.constants import EntityType

    return 1 if is_flexible(api_key, api_version, EntityType.response) else 0


def response_head(correlation_id: int, api_key: int, api_version: int) -> bytes:
    """The header of an answer the tunnel writes itself (no tagged fields)."""
    head = correlation_id.to_bytes(4, "big", signed=True)
    return head + b"\x00" if response_header_version(api_key, api_version) == 1 else head


_FIXED_HEADER = struct.Struct(">hhi")  # api key, api version, correlation id


def parse_request_header(frame: bytes) -> RequestHeader:
    """The header of a request frame (size prefix included).

    The fields every header version shares are always parsed; the body offset only when the
    API and version are known, because only then is the header version known.
    """
    if len(frame) < SIZE_PREFIX + 8:
        raise MalformedMessage(
            f"a request of {len(frame) - SIZE_PREFIX} bytes is too short for a request header "
            "(api key, version and correlation id need 8)"
        )
    api_key, api_version, correlation_id = _FIXED_HEADER.unpack_from(frame, SIZE_PREFIX)
    if api_key < 0 or api_version < 0:
        raise MalformedMessage(
            f"request header has api key {api_key} and version {api_version}: not a Kafka request"
        )
    try:
        header_version = request_header_version(api_key, api_version)
    except ProtocolError:
        header_version = None
    pos = SIZE_PREFIX + 8
    client_id: str | None = None
    if header_version != 0:
        client_id, pos = _client_id(frame, pos)
    body_offset: int | None = pos
    if header_version == 2:
        # almost always no tagged fields: one zero byte
        if pos < len(frame) and frame[pos] == 0:
            body_offset = pos + 1
        else:
            body_offset = wire.skip_tagged_fields(frame, pos)
    elif header_version is None:
        body_offset = None
    return RequestHeader(api_key, api_version, correlation_id, client_id, body_offset)


def _client_id(frame: bytes, pos: int) -> tuple[str | None, int]:
    """A header's client id (a legacy nullable string), read once per request: ASCII, as
    clients name themselves, without the general reader's calls."""
    if len(frame) >= pos + 2:
        length = int.from_bytes(frame[pos : pos + 2], "big", signed=True)
        end = pos + 2 + length
        if length < 0:
            return None, pos + 2
        raw = frame[pos + 2 : end]
        if len(raw) == length and raw.isascii():
            return raw.decode("ascii"), end
    return wire.read_string(frame, pos, compact=False)  # names the fault, or reads UTF-8


def response_correlation_id(frame: bytes) -> int:
    if len(frame) < SIZE_PREFIX + 4:
        raise MalformedMessage(
            f"a response of {len(frame) - SIZE_PREFIX} bytes is too short for a correlation id"
        )
    return int.from_bytes(frame[SIZE_PREFIX : SIZE_PREFIX + 4], "big", signed=True)


def response_body_offset(frame: bytes, api_key: int, api_version: int) -> int:
    pos = SIZE_PREFIX + 4
    if response_header_version(api_key, api_version) == 1:
        pos = wire.skip_tagged_fields(frame, pos)
    return pos


def top_level_error(frame: bytes, api_key: int, api_version: int) -> int | None:
    """A response's top-level error code, read without decoding the rest (some brokers put
    null in non-nullable strings of their error answers, which a full decode refuses);
    None when the response has none before its first variable-length field."""
    try:
        pos = response_body_offset(frame, api_key, api_version)
        for field in response_plan(api_key, api_version).fields:
            if field.name == "error_code":
                return wire.read_int16(frame, pos)[0]
            if field.kind is not FIXED:
                return None
            pos += field.size
    except ProtocolError:
        return None
    return None


def produce_acks(frame: bytes, header: RequestHeader) -> int:
    """The acks of a Produce request (0 means the broker sends no response)."""
    if header.body_offset is None:
        # An unknown Produce version: assume it is answered (the safe side: a wrong guess
        # only leaves one entry waiting, never drops a response).
        return -1
    pos = header.body_offset
    version = header.api_version
    if version >= 9 and pos < len(frame) and frame[pos] < 0x80:  # a short compact string
        pos += max(frame[pos], 1)  # its length + 1 (0: null), in one byte
    elif version >= 3:
        pos = wire.skip_string(frame, pos, compact=version >= 9)
    acks, _ = wire.read_int16(frame, pos)
    return acks


def expects_response(frame: bytes, header: RequestHeader) -> bool:
    return not (header.api_key == PRODUCE and produce_acks(frame, header) == 0)
