"""IP/TCP segments: building the synthetic ones a recording carries Kafka frames in, and
finding the TCP segment inside a captured packet of any common link type."""

from __future__ import annotations

import functools
import ipaddress
import struct
from collections.abc import Iterator
from typing import NamedTuple

from kafkatunnel.capture.pcapng import (
    CaptureFormatError,
    Interface,
    Packet,
    PcapngReader,
    is_pcapng,
)

SYN, FIN, ACK, PSH = 0x02, 0x01, 0x10, 0x08
MAX_SEGMENT = 65_000  # keeps every synthetic IPv4 packet under the 65,535-byte limit

LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW_ALIASES = (12, 14, 101)
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276

_IP_ETHERTYPES = (b"\x08\x00", b"\x86\xdd")
_IPV4_FIELDS = struct.Struct("!2xH2xH1xB2x4s4s")  # total length, fragment, protocol, addresses
_TCP_FIELDS = struct.Struct("!HHIIBB")
# An IPv4 header without options and a TCP header, written in one pack.
_IPV4_TCP = struct.Struct("!BBHHHBBH4s4sHHIIBBHHH")
_IPV6_TCP = struct.Struct("!IHBB16s16sHHIIBBHHH")
_IPV4_WORDS = struct.Struct("!10H")  # an IPv4 header without options, as 16-bit words
_IPV4_FLAGS, _TTL, _TCP_PROTOCOL, _TCP_HEADER_WORDS = 0x4000, 64, 6, 5 << 4
_HEADERS = 40  # an IPv4 header and a TCP header, both without options


class Flow:
    """One direction of a synthetic TCP conversation. Its addresses and ports never change,
    so the IP header's fixed words (and their share of the IPv4 checksum) are worked out
    once: a segment then costs one pack, which a recording does for every frame."""

    __slots__ = ("_dport", "_dst", "_partial", "_sport", "_src", "_v4")

    def __init__(self, src: tuple[str, int], dst: tuple[str, int]) -> None:
        source, dest = _address(src[0]), _address(dst[0])
        self._sport, self._dport = src[1], dst[1]
        self._v4 = source.version == 4 and dest.version == 4
        if self._v4:
            self._src, self._dst = source.packed, dest.packed
            fixed = _IPV4_TCP.pack(
                0x45, 0, 0, 0, _IPV4_FLAGS, _TTL, _TCP_PROTOCOL, 0, self._src, self._dst,
                0, 0, 0, 0, 0, 0, 0, 0, 0,
            )[:20]  # fmt: skip
            self._partial = sum(_IPV4_WORDS.unpack(fixed))  # all but the total length
        else:  # IPv4 addresses in an IPv6 conversation are written as mapped addresses
            self._src, self._dst = _as_v6(source).packed, _as_v6(dest).packed
            self._partial = 0

    def segment(self, seq: int, ack: int, flags: int, payload: bytes) -> bytes:
        """One IP packet holding one TCP segment. The TCP checksum is left zero, as a
        capture of checksum offload shows it; the IPv4 header checksum is correct."""
        seq &= 0xFFFFFFFF
        ack &= 0xFFFFFFFF
        if self._v4:
            total = _HEADERS + len(payload)
            checksum = self._partial + total
            checksum = (checksum & 0xFFFF) + (checksum >> 16)
            checksum = ~((checksum & 0xFFFF) + (checksum >> 16)) & 0xFFFF
            return _IPV4_TCP.pack(
                0x45, 0, total, 0, _IPV4_FLAGS, _TTL, _TCP_PROTOCOL, checksum, self._src,
                self._dst, self._sport, self._dport, seq, ack, _TCP_HEADER_WORDS, flags,
                65535, 0, 0,
            ) + payload  # fmt: skip
        return _IPV6_TCP.pack(
            6 << 28, 20 + len(payload), _TCP_PROTOCOL, _TTL, self._src, self._dst,
            self._sport, self._dport, seq, ack, _TCP_HEADER_WORDS, flags, 65535, 0, 0,
        ) + payload  # fmt: skip


@functools.lru_cache(maxsize=1024)
def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """Parsed once per address, not once per packet."""
    return ipaddress.ip_address(text)


def _as_v6(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv6Address:
    if isinstance(address, ipaddress.IPv6Address):
        return address
    return ipaddress.IPv6Address(f"::ffff:{address}")


def ip_tcp_segment(
    src: tuple[str, int], dst: tuple[str, int], seq: int, ack: int, flags: int, payload: bytes
) -> bytes:
    """One IP packet holding a TCP segment from src to dst (see Flow.segment)."""
    return Flow(src, dst).segment(seq, ack, flags, payload)


class Segment(NamedTuple):
    """A TCP segment (a named tuple: one is made per packet read)."""

    interface: int
    timestamp_ns: int
    src: str
    sport: int
    dst: str
    dport: int
    seq: int
    flags: int
    payload: bytes | memoryview


def _ip_start(linktype: int, data: memoryview) -> int | None:
    """Where the IP header starts in a link-layer frame, or None when it holds no IP."""
    if linktype in LINKTYPE_RAW_ALIASES or linktype in (LINKTYPE_IPV4, LINKTYPE_IPV6):
        return 0
    if linktype == LINKTYPE_NULL:
        return 4
    if linktype == LINKTYPE_ETHERNET:
        pos, ethertype = 12, 0
        while pos + 2 <= len(data):
            ethertype = struct.unpack_from("!H", data, pos)[0]
            if ethertype in (0x8100, 0x88A8):  # VLAN tags
                pos += 4
                continue
            break
        return pos + 2 if ethertype in (0x0800, 0x86DD) else None
    if linktype == LINKTYPE_LINUX_SLL:
        return 16 if data[14:16].tobytes() in _IP_ETHERTYPES else None
    if linktype == LINKTYPE_LINUX_SLL2:
        return 20 if data[0:2].tobytes() in _IP_ETHERTYPES else None
    return None


def _transport(data: memoryview, linktype: int) -> tuple[int, int, int, int] | None:
    """(IP protocol, where its header starts, where the IP packet ends, where the IP header
    starts) of an unfragmented IPv4 or IPv6 packet; None for anything else."""
    start = _ip_start(linktype, data)
    if start is None or len(data) < start + 20:
        return None
    version = data[start] >> 4
    if version == 4:
        total, fragment, protocol, _src, _dst = _IPV4_FIELDS.unpack_from(data, start)
        if fragment & 0x3FFF:
            return None
        at = start + (data[start] & 0x0F) * 4
        return protocol, at, start + total if total else len(data), start
    if version == 6 and len(data) >= start + 40:
        length, next_header = struct.unpack_from("!HB", data, start + 4)
        return next_header, start + 40, start + 40 + length, start
    return None


def dns_from_udp(packet: Packet, linktype: int) -> bytes | None:
    """The DNS message of a UDP datagram from port 53, or None for anything else."""
    data = memoryview(packet.data)
    found = _transport(data, linktype)
    if found is None or found[0] != 17:
        return None
    _protocol, udp_at, end, _start = found
    if len(data) < udp_at + 8 or struct.unpack_from("!H", data, udp_at)[0] != 53:
        return None
    return data[udp_at + 8 : min(end, len(data))].tobytes()


def tcp_segment(packet: Packet, linktype: int) -> Segment | None:
    """The TCP segment in a captured packet; None for anything else (ARP, UDP, fragments)."""
    data = packet.data
    start = _PLAIN_IPV4_AT.get(linktype)
    if linktype == LINKTYPE_ETHERNET and data[12:14] != b"\x08\x00":
        start = None
    if start is not None and len(data) >= start + 40 and data[start] == 0x45:
        # the bulk of any capture: IPv4 without options carrying TCP, read in one unpack
        total, fragment, protocol, src, dst, sport, dport, seq, offset, flags = (
            _IPV4_TCP_READ.unpack_from(data, start)
        )
        if protocol == 6 and not fragment & 0x3FFF:
            end = min(start + total, len(data)) if total else len(data)
            return Segment(
                packet.interface, packet.timestamp_ns, _V4.get(src) or _v4(src), sport,
                _V4.get(dst) or _v4(dst), dport, seq, flags,
                data[start + 20 + (offset >> 4) * 4 : end],
            )  # fmt: skip
    return _any_tcp_segment(packet, linktype)


def _any_tcp_segment(packet: Packet, linktype: int) -> Segment | None:
    data = memoryview(packet.data)
    found = _transport(data, linktype)
    if found is None or found[0] != 6:
        return None
    _protocol, tcp_at, end, start = found
    if data[start] >> 4 == 6:
        src = _v6(data[start + 8 : start + 24].tobytes())
        dst = _v6(data[start + 24 : start + 40].tobytes())
    else:
        src, dst = (
            _v4(data[start + 12 : start + 16].tobytes()),
            _v4(data[start + 16 : start + 20].tobytes()),
        )
    if len(data) < tcp_at + 20:
        return None
    sport, dport, seq, _ack, offset, flags = _TCP_FIELDS.unpack_from(data, tcp_at)
    payload_at = tcp_at + (offset >> 4) * 4
    return Segment(
        packet.interface, packet.timestamp_ns, src, sport, dst, dport, seq, flags,
        data[payload_at : min(end, len(data))],
    )  # fmt: skip


_V4: dict[bytes, str] = {}  # addresses as text, for the fast path (bounded by _v4)
# Where a plain IPv4 header starts, per link type
_PLAIN_IPV4_AT = {
    **dict.fromkeys(LINKTYPE_RAW_ALIASES, 0), LINKTYPE_IPV4: 0, LINKTYPE_NULL: 4,
    LINKTYPE_ETHERNET: 14,
}  # fmt: skip
# total length, fragment, protocol, addresses; source and destination ports, sequence,
# data offset, flags
_IPV4_TCP_READ = struct.Struct("!2xH2xH1xB2x4s4sHHI4xBB")


def _v4(raw: bytes) -> str:
    if len(_V4) >= 4096:  # a capture of many hosts: start again rather than grow
        _V4.clear()
    text = _V4[raw] = ipaddress.IPv4Address(raw).compressed
    return text


@functools.lru_cache(maxsize=4096)
def _v6(raw: bytes) -> str:
    address = ipaddress.IPv6Address(raw)
    return address.ipv4_mapped.compressed if address.ipv4_mapped else address.compressed


_PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1_000_000),
    b"\xa1\xb2\xc3\xd4": (">", 1_000_000),
    b"\x4d\x3c\xb2\xa1": ("<", 1_000_000_000),
    b"\xa1\xb2\x3c\x4d": (">", 1_000_000_000),
}


class Capture:
    """A pcap or pcapng file's TCP segments, and the interfaces and comments it holds."""

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.interfaces: list[Interface] = []
        self.comments: list[str] = []
        self.dns: list[tuple[int, bytes]] = []  # (ts, message) of DNS answers over UDP
        self.cut_short_at: int | None = None  # the byte where a file cut short ends
        if is_pcapng(self.data):
            self._format = "pcapng"
        elif self.data[:4].tobytes() in _PCAP_MAGICS:
            self._format = "pcap"
        else:
            raise CaptureFormatError(
                "not a pcap or pcapng file (record with `kafkatunnel up --record DIR`, "
                "or `tcpdump -w FILE`)"
            )

    def segments(self) -> Iterator[Segment]:
        if self._format == "pcapng":
            reader = PcapngReader(self.data)
            self.interfaces = reader.interfaces
            self.comments = reader.comments
            for packet in reader:
                self.interfaces = interfaces = reader.interfaces  # a new section: new list
                if packet.interface < len(interfaces):
                    segment = self._segment(packet, interfaces[packet.interface].linktype)
                    if segment is not None:
                        yield segment
            self.cut_short_at = reader.cut_short_at
            return
        yield from self._pcap_segments()

    def _segment(self, packet: Packet, linktype: int) -> Segment | None:
        segment = tcp_segment(packet, linktype)
        if segment is None:  # rare in a Kafka capture: a DNS answer, perhaps
            message = dns_from_udp(packet, linktype)
            if message is not None:
                self.dns.append((packet.timestamp_ns, message))
        return segment

    def _pcap_segments(self) -> Iterator[Segment]:
        data = self.data
        order, per_second = _PCAP_MAGICS[data[:4].tobytes()]
        if len(data) < 24:
            raise CaptureFormatError("a pcap file shorter than its 24-byte header")
        linktype = struct.unpack_from(order + "I", data, 20)[0] & 0x0FFFFFFF
        self.interfaces = [Interface(linktype, "", "", per_second)]
        record = struct.Struct(order + "IIII")
        pos = 24
        while pos + 16 <= len(data):
            seconds, fraction, captured, _original = record.unpack_from(data, pos)
            pos += 16
            if pos + captured > len(data):
                self.cut_short_at = pos - 16  # cut short while being written
                return
            ns = seconds * 1_000_000_000 + fraction * (1_000_000_000 // per_second)
            segment = self._segment(Packet(0, ns, data[pos : pos + captured]), linktype)
            if segment is not None:
                yield segment
            pos += captured
        if pos < len(data):
            self.cut_short_at = pos  # less than a record header left
