"""The pcapng blocks a recording writes, read back by our reader; IP/TCP segments built and
parsed; classic pcap and link types a capture tool writes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafkatunnel.capture import pcapng
from kafkatunnel.capture.packets import (
    ACK,
    LINKTYPE_ETHERNET,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_NULL,
    PSH,
    SYN,
    Capture,
    ip_tcp_segment,
    tcp_segment,
)
from kafkatunnel.capture.pcapng import CaptureFormatError, Packet, PcapngReader

pytestmark = pytest.mark.quick


def test_blocks_round_trip_with_interfaces_and_nanosecond_times() -> None:
    data = (
        pcapng.section_header("run 1", "kafkatunnel test")
        + pcapng.interface_description("bootstrap", '{"node_id":null}')
        + pcapng.interface_description("broker-1", '{"node_id":1}')
        + pcapng.enhanced_packet(1, 1_795_000_000_123_456_789, b"abc")
        + pcapng.enhanced_packet(0, 5, b"")
    )
    reader = PcapngReader(data)
    packets = list(reader)
    assert [(p.interface, p.timestamp_ns, bytes(p.data)) for p in packets] == [
        (1, 1_795_000_000_123_456_789, b"abc"),
        (0, 5, b""),
    ]
    assert [(i.name, i.description) for i in reader.interfaces] == [
        ("bootstrap", '{"node_id":null}'),
        ("broker-1", '{"node_id":1}'),
    ]
    assert reader.comments == ["run 1"]


def test_a_file_cut_while_being_written_keeps_its_whole_blocks() -> None:
    data = (
        pcapng.section_header("c", "a")
        + pcapng.interface_description("x", "y")
        + pcapng.enhanced_packet(0, 1, b"whole")
    )
    cut = data + pcapng.enhanced_packet(0, 2, b"cut short")[:-7]
    assert [bytes(p.data) for p in PcapngReader(cut)] == [b"whole"]


def test_garbage_is_named_as_not_a_capture() -> None:
    with pytest.raises(CaptureFormatError, match="not a pcap or pcapng file"):
        Capture(b"GET / HTTP/1.1\r\n\r\n")
    no_magic = pcapng.section_header("c", "a")[:8] + b"\0" * 20
    with pytest.raises(CaptureFormatError, match="no byte-order magic"):
        list(PcapngReader(no_magic))
    header = pcapng.section_header("c", "a")
    bad_block = header + struct.pack("<II", 6, 13) + b"\0" * 20
    with pytest.raises(CaptureFormatError, match="has length 13"):
        list(PcapngReader(bad_block))


@given(
    payload=st.binary(max_size=3000),
    seq=st.integers(0, 2**32 - 1),
    ports=st.tuples(st.integers(1, 65535), st.integers(1, 65535)),
    v6=st.booleans(),
)
def test_segments_built_are_parsed_back(
    payload: bytes, seq: int, ports: tuple[int, int], v6: bool
) -> None:
    src, dst = ("::1", "fe80::2") if v6 else ("127.0.0.1", "10.1.2.3")
    packet = ip_tcp_segment((src, ports[0]), (dst, ports[1]), seq, 7, PSH | ACK, payload)
    segment = tcp_segment(Packet(0, 0, packet), pcapng.LINKTYPE_RAW)
    assert segment is not None
    assert (segment.src, segment.sport, segment.dst, segment.dport) == (
        src,
        ports[0],
        dst,
        ports[1],
    )
    assert (segment.seq, segment.flags, bytes(segment.payload)) == (seq, PSH | ACK, payload)
    if not v6:
        words = struct.unpack("!10H", packet[:20])
        total = sum(words)
        assert (total & 0xFFFF) + (total >> 16) == 0xFFFF  # the IPv4 header checksum holds


def _ethernet(ip_packet: bytes, vlan: bool = False) -> bytes:
    head = b"\x02" * 6 + b"\x04" * 6
    if vlan:
        head += b"\x81\x00\x00\x07"
    return head + b"\x08\x00" + ip_packet


@pytest.mark.parametrize(
    ("linktype", "frame"),
    [
        (LINKTYPE_ETHERNET, lambda p: _ethernet(p)),
        (LINKTYPE_ETHERNET, lambda p: _ethernet(p, vlan=True)),
        (LINKTYPE_LINUX_SLL, lambda p: b"\x00\x00\x03\x04\x00\x06" + b"\x01" * 8 + b"\x08\x00" + p),
        (LINKTYPE_NULL, lambda p: struct.pack("<I", 2) + p),
    ],
    ids=["ethernet", "vlan", "linux-cooked", "bsd-loopback"],
)
def test_link_types_of_classic_pcap(linktype: int, frame: object) -> None:
    ip_packet = ip_tcp_segment(("10.0.0.1", 40000), ("10.0.0.2", 9092), 1, 0, SYN, b"")
    data_packet = ip_tcp_segment(("10.0.0.1", 40000), ("10.0.0.2", 9092), 2, 0, PSH, b"kafka")
    records = b""
    for index, packet in enumerate((ip_packet, data_packet)):
        body = frame(packet)  # type: ignore[operator]
        records += struct.pack("<IIII", 100 + index, 250, len(body), len(body)) + body
    header = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, linktype)
    segments = list(Capture(header + records).segments())
    assert [(s.flags, bytes(s.payload)) for s in segments] == [(SYN, b""), (PSH, b"kafka")]
    assert segments[1].timestamp_ns == 101_000_250_000
