"""DNS answers inside captures: from UDP datagrams of port 53 and from DNS over TCP (two-byte
length prefixes, split anywhere), read with dnslib; queries and garbage give nothing."""

from __future__ import annotations

import struct

import pytest
from dnslib import AAAA, CNAME, QTYPE, RR, A, DNSRecord

from kafkatunnel.capture.packets import LINKTYPE_IPV4, dns_from_udp, tcp_segment
from kafkatunnel.capture.pcapng import Packet
from kafkatunnel.verify.resolutions import DnsAnswer, TcpDnsStream, answers_in

pytestmark = pytest.mark.quick

NAME = "kafka-1.kafka-headless.shop.svc.cluster.local"


def _answer() -> bytes:
    question = DNSRecord.question(NAME, "A")
    reply = question.reply()
    reply.add_answer(RR(NAME, QTYPE.CNAME, rdata=CNAME("relay.example."), ttl=5))
    reply.add_answer(RR("relay.example", QTYPE.A, rdata=A("127.0.0.3"), ttl=5))
    reply.add_answer(RR("relay.example", QTYPE.AAAA, rdata=AAAA("::3"), ttl=5))
    return bytes(reply.pack())


def _udp(sport: int, payload: bytes) -> bytes:
    udp = struct.pack("!HHHH", sport, 40000, 8 + len(payload), 0) + payload
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0,
                         bytes([10, 0, 0, 2]), bytes([10, 0, 0, 1]))  # fmt: skip
    return header + udp


def test_a_udp_answer_is_read_with_its_cname_chain() -> None:
    packet = Packet(0, 7, _udp(53, _answer()))
    message = dns_from_udp(packet, LINKTYPE_IPV4)
    assert message is not None and tcp_segment(packet, LINKTYPE_IPV4) is None
    assert answers_in(7, message) == [
        DnsAnswer(7, NAME, "relay.example"),
        DnsAnswer(7, "relay.example", "127.0.0.3"),
        DnsAnswer(7, "relay.example", "::3"),
    ]


def test_queries_other_ports_and_garbage_give_nothing() -> None:
    query = bytes(DNSRecord.question(NAME, "A").pack())
    assert answers_in(0, query) == []
    assert answers_in(0, b"\x00\x01garbage") == []
    assert dns_from_udp(Packet(0, 0, _udp(5353, _answer())), LINKTYPE_IPV4) is None


def test_dns_over_tcp_messages_split_anywhere() -> None:
    one, two = _answer(), _answer()
    stream = bytes(len(one).to_bytes(2, "big")) + one + len(two).to_bytes(2, "big") + two
    for cut in (1, 2, 3, len(one), len(one) + 3, len(stream) - 1):
        reader = TcpDnsStream()
        assert reader.feed(stream[:cut]) + reader.feed(stream[cut:]) == [one, two]
