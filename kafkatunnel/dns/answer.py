"""Answering one DNS query: pure, bytes in and bytes out (dnslib does the wire format).

A records for the brokers' names, an empty NOERROR answer for their other types (AAAA:
clients then use the IPv4 address), NXDOMAIN for other names inside the zone, REFUSED for
every name outside it: the shim is never an open resolver. Garbage gets FORMERR when a
header can be read, and no answer at all when it cannot.
"""

from __future__ import annotations

from dnslib import QTYPE, RCODE, RR, A, DNSError, DNSRecord

from kafkatunnel.dns.names import Zone

TTL = 5  # short: the tunnel may move a broker to another address on restart
UDP_LIMIT = 512  # without EDNS0


def answer(query: bytes, zone: Zone, udp: bool = True) -> bytes | None:
    """The response to `query`, or None when it is not a DNS query at all."""
    try:
        request = DNSRecord.parse(query)
    except (DNSError, ValueError, IndexError, UnicodeDecodeError, KeyError):
        return _formerr(query)
    if request.header.qr or request.header.opcode != 0:
        return None  # a response, or not a standard query: never answer those
    reply = request.reply()
    reply.header.ra = 0
    reply.header.aa = 1
    if not request.questions:
        reply.header.rcode = RCODE.FORMERR
        return bytes(reply.pack())
    refused = False
    nxdomain = False
    for question in request.questions:
        name = str(question.qname)
        if not zone.contains(name):
            refused = True
            continue
        address = zone.lookup(name)
        if address is None:
            nxdomain = True
        elif question.qtype in (QTYPE.A, QTYPE.ANY):
            reply.add_answer(RR(question.qname, QTYPE.A, rdata=A(address), ttl=TTL))
    if refused:
        reply.rr = []
        reply.header.rcode = RCODE.REFUSED
    elif nxdomain and not reply.rr:
        reply.header.rcode = RCODE.NXDOMAIN
    packed = bytes(reply.pack())
    limit = _udp_limit(request) if udp else 65535
    if len(packed) > limit:
        reply.rr = []
        reply.header.tc = 1
        packed = bytes(reply.pack())
    return packed


def _udp_limit(request: DNSRecord) -> int:
    for rr in request.ar:
        if rr.rtype == QTYPE.OPT:
            return max(UDP_LIMIT, int(rr.rclass))  # EDNS0: the client's buffer size
    return UDP_LIMIT


def _formerr(query: bytes) -> bytes | None:
    if len(query) < 12:
        return None
    if query[2] & 0x80:
        return None  # the QR bit: a response; never answer it
    # Echo the id, set QR and FORMERR, no sections.
    flags = bytes([0x80 | (query[2] & 0x79), 0x01])
    return query[:2] + flags + b"\x00" * 8
