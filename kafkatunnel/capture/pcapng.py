"""The pcapng block format (draft-ietf-opsawg-pcapng): encoding the blocks a recording needs
and decoding the blocks any capture tool writes. Pure functions over bytes."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

SECTION_HEADER = 0x0A0D0D0A
INTERFACE_DESCRIPTION = 0x00000001
OBSOLETE_PACKET = 0x00000002
SIMPLE_PACKET = 0x00000003
ENHANCED_PACKET = 0x00000006
BYTE_ORDER_MAGIC = 0x1A2B3C4D

OPT_END = 0
OPT_COMMENT = 1
IF_NAME = 2
IF_DESCRIPTION = 3
IF_TSRESOL = 9
SHB_USERAPPL = 4

LINKTYPE_RAW = 101  # the packet starts with an IPv4 or IPv6 header

_U32 = struct.Struct("<I")


# per byte order: a block's type and length; an enhanced packet's interface, timestamp
# and captured length
_HEADS = {order: (struct.Struct(order + "II"), struct.Struct(order + "IIII")) for order in "<>"}


class CaptureFormatError(ValueError):
    """The bytes are not a pcap or pcapng capture this reader understands."""


def _pad(data: bytes) -> bytes:
    return data + b"\x00" * (-len(data) % 4)


def _options(options: list[tuple[int, bytes]]) -> bytes:
    if not options:
        return b""
    out = bytearray()
    for code, value in options:
        out += struct.pack("<HH", code, len(value)) + _pad(value)
    out += struct.pack("<HH", OPT_END, 0)
    return bytes(out)


def _block(block_type: int, body: bytes) -> bytes:
    total = 12 + len(body)
    return struct.pack("<II", block_type, total) + body + _U32.pack(total)


def section_header(comment: str, application: str) -> bytes:
    body = struct.pack("<IHHq", BYTE_ORDER_MAGIC, 1, 0, -1) + _options(
        [(OPT_COMMENT, comment.encode()), (SHB_USERAPPL, application.encode())]
    )
    return _block(SECTION_HEADER, body)


def interface_description(name: str, description: str, linktype: int = LINKTYPE_RAW) -> bytes:
    """An interface with nanosecond timestamps."""
    body = struct.pack("<HHI", linktype, 0, 0) + _options(
        [(IF_NAME, name.encode()), (IF_DESCRIPTION, description.encode()), (IF_TSRESOL, b"\x09")]
    )
    return _block(INTERFACE_DESCRIPTION, body)


_ENHANCED_PACKET_HEAD = struct.Struct("<IIIIIII")  # block type, length, then the packet's


def enhanced_packet(interface: int, timestamp_ns: int, packet: bytes) -> bytes:
    """One packet in a block (one pack and one join: a recording writes one per frame)."""
    size = len(packet)
    padding = -size % 4
    total = 32 + size + padding
    head = _ENHANCED_PACKET_HEAD.pack(
        ENHANCED_PACKET, total, interface, timestamp_ns >> 32, timestamp_ns & 0xFFFFFFFF,
        size, size,
    )  # fmt: skip
    return b"".join((head, packet, _PADDING[padding], _U32.pack(total)))


_PADDING = (b"", b"\0", b"\0\0", b"\0\0\0")


@dataclass(frozen=True, slots=True)
class Interface:
    linktype: int
    name: str
    description: str
    ticks_per_second: int


class Packet(NamedTuple):
    """A captured packet (a named tuple: one is made per packet read)."""

    interface: int  # index into the section's interfaces
    timestamp_ns: int
    data: bytes | memoryview


def _parse_options(data: memoryview, order: str) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    pos = 0
    while pos + 4 <= len(data):
        code, length = struct.unpack_from(order + "HH", data, pos)
        pos += 4
        if code == OPT_END:
            break
        found.setdefault(code, bytes(data[pos : pos + length]))
        pos += length + (-length % 4)
    return found


def _resolution(raw: bytes | None) -> int:
    if not raw:
        return 1_000_000
    value = raw[0]
    exponent = value & 0x7F
    return int(2**exponent) if value & 0x80 else int(10**exponent)


class PcapngReader:
    """Packets of a pcapng file in order; `sections` and `interfaces` grow as blocks arrive."""

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.interfaces: list[Interface] = []
        self.comments: list[str] = []
        self.cut_short_at: int | None = None  # where a file cut short mid-block ends

    def __iter__(self) -> Iterator[Packet]:
        data = self.data
        pos, end = 0, len(data)
        order = "<"
        head, packet_head = _HEADS[order]
        nanoseconds: list[bool] = []  # per interface: timestamps already in ns (recordings)
        while pos + 12 <= end:
            block_type, length = head.unpack_from(data, pos)
            if block_type == ENHANCED_PACKET and 32 <= length <= end - pos and not length % 4:
                # the bulk of any capture, as recordings write it: one unpack for its fields
                iface, high, low, captured = packet_head.unpack_from(data, pos + 8)
                if iface < len(nanoseconds) and nanoseconds[iface] and captured <= length - 32:
                    yield Packet(iface, (high << 32) | low, data[pos + 28 : pos + 28 + captured])
                    pos += length
                    continue
            if block_type == SECTION_HEADER:
                magic = data[pos + 8 : pos + 12].tobytes()
                if magic == b"\x4d\x3c\x2b\x1a":
                    order = "<"
                elif magic == b"\x1a\x2b\x3c\x4d":
                    order = ">"
                else:
                    raise CaptureFormatError(f"pcapng section at {pos} has no byte-order magic")
                head, packet_head = _HEADS[order]
                (length,) = struct.unpack_from(order + "I", data, pos + 4)
                self.interfaces = []
                nanoseconds = []
            if length < 12 or length % 4 or pos + length > end:
                if pos + length > end and length >= 12:
                    self.cut_short_at = pos  # cut short while being written: keep what is whole
                    return
                raise CaptureFormatError(f"pcapng block at offset {pos} has length {length}")
            body = data[pos + 8 : pos + length - 4]
            if block_type == SECTION_HEADER:
                options = _parse_options(body[16:], order)
                if OPT_COMMENT in options:
                    self.comments.append(options[OPT_COMMENT].decode("utf-8", "replace"))
            elif block_type == INTERFACE_DESCRIPTION:
                linktype = struct.unpack_from(order + "H", body, 0)[0]
                options = _parse_options(body[8:], order)
                interface = Interface(
                    linktype,
                    options.get(IF_NAME, b"").decode("utf-8", "replace"),
                    options.get(IF_DESCRIPTION, b"").decode("utf-8", "replace"),
                    _resolution(options.get(IF_TSRESOL)),
                )
                self.interfaces.append(interface)
                nanoseconds.append(interface.ticks_per_second == 1_000_000_000)
            elif block_type == ENHANCED_PACKET:
                iface, high, low, captured = struct.unpack_from(order + "IIII", body, 0)
                yield Packet(iface, self._ns(iface, (high << 32) | low), body[20 : 20 + captured])
            elif block_type == SIMPLE_PACKET:
                (original,) = struct.unpack_from(order + "I", body, 0)
                captured = min(original, len(body) - 4)
                yield Packet(0, 0, body[4 : 4 + captured])
            elif block_type == OBSOLETE_PACKET:
                iface, _drops, high, low, captured = struct.unpack_from(order + "HHIII", body, 0)
                yield Packet(iface, self._ns(iface, (high << 32) | low), body[20 : 20 + captured])
            pos += length
        if pos < end:
            self.cut_short_at = pos  # less than a block header left

    def _ns(self, iface: int, ticks: int) -> int:
        if iface >= len(self.interfaces):
            raise CaptureFormatError(f"a packet names interface {iface}, which was not described")
        per_second = self.interfaces[iface].ticks_per_second
        if per_second == 1_000_000_000:
            return ticks
        return ticks * 1_000_000_000 // per_second


def is_pcapng(data: bytes | memoryview) -> bool:
    return bytes(data[:4]) == b"\x0a\x0d\x0d\x0a"
