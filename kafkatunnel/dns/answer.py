"""Answering one DNS query: pure, bytes in and bytes out (dnslib does the wire format).

The shim is an authoritative server for the cluster's zones and nothing else, answering as
a resolver in front of it expects:

- A records for the brokers' names; NOERROR with no answer (NODATA) for their other types
  (AAAA: clients then use the IPv4 address) and for every name between a zone's apex and
  the brokers (`demo.svc.cluster.local`): a resolver applying RFC 8020 takes NXDOMAIN there
  to mean nothing exists below, broker names included.
- NXDOMAIN for other names in a zone. Negative answers carry the zone's SOA in the
  authority section (RFC 2308), whose minimum is the negative TTL.
- AA only on those answers. REFUSED for names outside the zones (never an open resolver)
  and for classes other than IN; NOTIMP for opcodes other than QUERY; FORMERR for a
  question count other than one (RFC 9619) and for every packet that does not parse.
- EDNS (RFC 6891): an OPT record in every reply to a query that had one (the DO bit
  copied), BADVERS for versions above 0, FORMERR for more than one OPT.
- Packets without a whole header, and responses, get no reply at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from dnslib import CLASS, EDNS0, QTYPE, RCODE, RR, SOA, A, DNSHeader, DNSQuestion, DNSRecord

from kafkatunnel.dns.names import Zone

TTL = 5  # short: the tunnel may move a broker to another address on restart
NEGATIVE_TTL = 5  # the SOA minimum: how long "no such name" may be cached
UDP_LIMIT = 512  # without EDNS0
EDNS_UDP_SIZE = 1232  # what we accept over UDP (the DNS flag day 2020 value)
HEADER = 12
OPCODE_QUERY = 0
BADVERS = 16  # an extended rcode: its upper bits travel in the OPT record
SOA_NAMES = ("kafkatunnel.invalid.", "hostmaster.kafkatunnel.invalid.")


@dataclass(frozen=True)
class Reply:
    """What to send back (None: nothing), and what was wrong with the query, if anything
    (for counting and logging; never its content)."""

    packet: bytes | None
    problem: str | None = None


def answer(query: bytes, zone: Zone, udp: bool = True) -> bytes | None:
    """The response to `query`, or None when it gets none."""
    return respond(query, zone, udp).packet


def respond(query: bytes, zone: Zone, udp: bool = True) -> Reply:
    if len(query) < HEADER:
        return Reply(None, "shorter than a DNS header")
    if query[2] & 0x80:
        return Reply(None, "a DNS response, not a query")
    opcode = (query[2] >> 3) & 0xF
    if opcode != OPCODE_QUERY:
        return Reply(_header_only(query, RCODE.NOTIMP), f"opcode {opcode}: only QUERY is served")
    try:
        request = DNSRecord.parse(query)
        return _serve(query, request, zone, udp)
    except Exception as error:  # dnslib raises many kinds, some only when echoing a name
        return Reply(_header_only(query, RCODE.FORMERR), f"malformed ({type(error).__name__})")


def _serve(query: bytes, request: DNSRecord, zone: Zone, udp: bool) -> Reply:
    if len(request.questions) != 1:
        count = len(request.questions)
        return Reply(_header_only(query, RCODE.FORMERR), f"{count} questions instead of one")
    opts = [rr for rr in request.ar if rr.rtype == QTYPE.OPT]
    if len(opts) > 1:
        return Reply(_header_only(query, RCODE.FORMERR), "more than one OPT record")
    edns = opts[0] if opts else None
    question = request.q
    reply = DNSRecord(DNSHeader(id=request.header.id, qr=1, rd=request.header.rd, ra=0), q=question)
    if edns is not None and (edns.ttl >> 16) & 0xFF != 0:
        _add_opt(reply, edns, BADVERS)
        return Reply(bytes(reply.pack()), "EDNS version above 0")
    if question.qclass != CLASS.IN or (apex := zone.apex_of(str(question.qname))) is None:
        reply.header.rcode = RCODE.REFUSED
    else:
        _authoritative(reply, question, zone, apex)
    if edns is not None:
        _add_opt(reply, edns)
    return Reply(_fit(reply, _udp_limit(edns) if udp else 65535))


def _authoritative(reply: DNSRecord, question: DNSQuestion, zone: Zone, apex: str) -> None:
    reply.header.aa = 1
    name = str(question.qname)
    address = zone.lookup(name)
    if address is not None and question.qtype in (QTYPE.A, QTYPE.ANY):
        reply.add_answer(RR(question.qname, QTYPE.A, rdata=A(address), ttl=TTL))
        return
    soa = RR(apex + ".", QTYPE.SOA, rdata=SOA(*SOA_NAMES, _soa_times(zone)), ttl=NEGATIVE_TTL)
    if question.qtype in (QTYPE.SOA, QTYPE.ANY) and name.rstrip(".").lower() == apex:
        reply.add_answer(soa)
        return
    if not zone.exists(name):
        reply.header.rcode = RCODE.NXDOMAIN
    reply.add_auth(soa)  # NXDOMAIN or NODATA: the SOA says for how long


def _soa_times(zone: Zone) -> tuple[int, int, int, int, int]:
    """serial, refresh, retry, expire, minimum (the negative TTL, RFC 2308)."""
    return (zone.serial, 60, 60, 300, NEGATIVE_TTL)


def _add_opt(reply: DNSRecord, edns: RR, extended_rcode: int = 0) -> None:
    """Our OPT record, the query's DO bit copied; an extended rcode (BADVERS) replaces the
    header's, whose four bits it shares."""
    if extended_rcode:
        reply.header.rcode = extended_rcode & 0xF
    do = "do" if edns.ttl & 0x8000 else ""
    opt = EDNS0(ext_rcode=extended_rcode >> 4, version=0, flags=do, udp_len=EDNS_UDP_SIZE)
    reply.add_ar(opt)


def _udp_limit(edns: RR | None) -> int:
    if edns is None:
        return UDP_LIMIT
    return max(UDP_LIMIT, min(int(edns.rclass), EDNS_UDP_SIZE))


def _fit(reply: DNSRecord, limit: int) -> bytes:
    """The packed reply; over the limit, truncated (TC) to its header, question and OPT."""
    packed = bytes(reply.pack())
    if len(packed) > limit:
        reply.rr = []
        reply.auth = []
        reply.header.tc = 1
        packed = bytes(reply.pack())
    return packed


def _header_only(query: bytes, rcode: int) -> bytes:
    """A reply that echoes the id, opcode and RD of a query that could not be served, with
    `rcode` and no sections (AA clear: nothing here is an authoritative answer)."""
    flags = bytes([0x80 | (query[2] & 0x79), rcode & 0xF])
    return query[:2] + flags + b"\x00" * 8
