"""Bounds-checked readers and writers for Kafka's primitive types.

Every reader takes (buffer, offset) and returns (value, next_offset), raising
MalformedMessage instead of IndexError or struct.error when the buffer ends early.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

from kafkatunnel.protocol.errors import MalformedMessage

Buffer = bytes | bytearray | memoryview

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")


def need(buf: Buffer, pos: int, size: int, what: str) -> None:
    if size < 0 or pos + size > len(buf):
        raise MalformedMessage(
            f"{what} needs {size} bytes at offset {pos}, but the message has {len(buf)}"
        )


def read_int16(buf: Buffer, pos: int) -> tuple[int, int]:
    need(buf, pos, 2, "an int16")
    return _I16.unpack_from(buf, pos)[0], pos + 2


def read_int32(buf: Buffer, pos: int) -> tuple[int, int]:
    need(buf, pos, 4, "an int32")
    return _I32.unpack_from(buf, pos)[0], pos + 4


def read_uint16(buf: Buffer, pos: int) -> tuple[int, int]:
    need(buf, pos, 2, "a uint16")
    return _U16.unpack_from(buf, pos)[0], pos + 2


def read_uvarint(buf: Buffer, pos: int) -> tuple[int, int]:
    """An unsigned varint (at most 5 bytes, as Kafka's ByteUtils.readUnsignedVarint)."""
    value = 0
    shift = 0
    for index in range(5):
        if pos + index >= len(buf):
            raise MalformedMessage(f"a varint at offset {pos} runs past the end of the message")
        byte = buf[pos + index]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + index + 1
        shift += 7
    raise MalformedMessage(f"a varint at offset {pos} is longer than 5 bytes")


def write_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_string(buf: Buffer, pos: int, compact: bool) -> tuple[str | None, int]:
    """A (nullable) string: int16 length (-1 null), or compact uvarint length + 1 (0 null)."""
    if compact:
        length, pos = read_uvarint(buf, pos)
        length -= 1
    else:
        length, pos = read_int16(buf, pos)
    if length < 0:
        return None, pos
    need(buf, pos, length, "a string")
    try:
        return bytes(buf[pos : pos + length]).decode(), pos + length
    except UnicodeDecodeError as error:
        raise MalformedMessage(f"a string at offset {pos} is not UTF-8: {error}") from None


def skip_string(buf: Buffer, pos: int, compact: bool) -> int:
    """Past a (nullable) string, unread."""
    if compact:
        length, pos = read_uvarint(buf, pos)
        length -= 1
    else:
        length, pos = read_int16(buf, pos)
    if length > 0:
        need(buf, pos, length, "a string")
        pos += length
    return pos


def write_string(value: str, compact: bool) -> bytes:
    raw = value.encode()
    if compact:
        return write_uvarint(len(raw) + 1) + raw
    return _I16.pack(len(raw)) + raw


def write_int32(value: int) -> bytes:
    return _I32.pack(value)


def write_uint16(value: int) -> bytes:
    return _U16.pack(value)


def skip_tagged_fields(buf: Buffer, pos: int) -> int:
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        need(buf, pos, size, "a tagged field")
        pos += size
    return pos


class TaggedField(NamedTuple):
    tag: int
    start: int  # where the field (its tag) starts
    data: int  # where its payload starts
    end: int


def tagged_fields(buf: Buffer, pos: int) -> Iterator[TaggedField]:
    """Each field of a tagged-field section at pos, checked to lie within buf."""
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        start = pos
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        need(buf, pos, size, "a tagged field")
        yield TaggedField(tag, start, pos, pos + size)
        pos += size
