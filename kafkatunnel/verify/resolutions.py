"""The DNS answers a capture holds (over UDP, or TCP with its two-byte length prefixes):
which addresses the laptop was told a broker's advertised name has, for identifying the
broker behind a captured address. dnslib reads the messages."""

from __future__ import annotations

from typing import NamedTuple

from dnslib import QTYPE, DNSError, DNSRecord


class DnsAnswer(NamedTuple):
    ts: int
    name: str  # lower case, no trailing dot
    address: str  # an A or AAAA record's address, or a CNAME's target name


_KEPT = {QTYPE.A, QTYPE.AAAA, QTYPE.CNAME}


def answers_in(ts: int, message: bytes) -> list[DnsAnswer]:
    """A, AAAA and CNAME records of one DNS response ([] for queries and anything else)."""
    try:
        record = DNSRecord.parse(message)
    except (DNSError, ValueError, IndexError, UnicodeError, KeyError):
        return []
    if not record.header.qr:
        return []
    return [
        DnsAnswer(ts, str(rr.rname).lower().rstrip("."), str(rr.rdata).lower().rstrip("."))
        for rr in record.rr
        if rr.rtype in _KEPT
    ]


class TcpDnsStream:
    """DNS messages over TCP from one server: each after a two-byte length."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes | memoryview) -> list[bytes]:
        self.buffer += data
        out = []
        while len(self.buffer) >= 2:
            size = int.from_bytes(self.buffer[:2], "big")
            if len(self.buffer) < 2 + size:
                break
            out.append(bytes(self.buffer[2 : 2 + size]))
            del self.buffer[: 2 + size]
        return out
