"""Answers a DNS expert accepts: SOA in negative answers (RFC 2308), NODATA for empty
non-terminals (RFC 8020), EDNS (RFC 6891), AA only where authoritative, FORMERR for a
question count other than one (RFC 9619), NOTIMP and REFUSED; each point checked on the
sans-I/O answer and, with dig (bind9-dnsutils), on the running shim."""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from dnslib import CLASS, EDNS0, OPCODE, QTYPE, RCODE, DNSHeader, DNSQuestion, DNSRecord
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkatunnel.dns import Zone
from kafkatunnel.dns.answer import EDNS_UDP_SIZE, NEGATIVE_TTL, answer, respond
from kafkatunnel.dns.server import DnsServer
from kafkatunnel.ratelimit import RateLimitedLog
from tests.dns import names_of

pytestmark = pytest.mark.quick

FULL = "kafka-{}.kafka-headless.demo.svc.cluster.local"
EMPTY_NON_TERMINALS = [
    "cluster.local", "svc.cluster.local", "demo.svc.cluster.local",
    "kafka-headless.demo.svc.cluster.local", "svc", "demo.svc", "kafka-headless.demo.svc",
]  # fmt: skip


@pytest.fixture(scope="module")
def zone() -> Zone:
    z = Zone()
    for i in range(3):
        z.add(names_of(FULL.format(i)), f"127.0.0.{2 + i}")
    return z


def reply_to(zone: Zone, query: DNSRecord | bytes, udp: bool = True) -> DNSRecord:
    raw = answer(query if isinstance(query, bytes) else query.pack(), zone, udp=udp)
    assert raw is not None
    return DNSRecord.parse(raw)


def soa_apex(reply: DNSRecord) -> str:
    (soa,) = [rr for rr in reply.auth if rr.rtype == QTYPE.SOA]
    assert soa.ttl == NEGATIVE_TTL and soa.rdata.times[-1] == NEGATIVE_TTL
    return str(soa.rname).rstrip(".")


def test_nxdomain_carries_the_zones_soa(zone: Zone) -> None:
    reply = reply_to(zone, DNSRecord.question("kafka-9.kafka-headless.demo.svc.cluster.local"))
    assert reply.header.rcode == RCODE.NXDOMAIN and reply.header.aa == 1 and not reply.rr
    assert soa_apex(reply) == "cluster.local"
    short = reply_to(zone, DNSRecord.question("kafka-9.kafka-headless.demo.svc"))
    assert short.header.rcode == RCODE.NXDOMAIN and soa_apex(short) == "svc"


@pytest.mark.parametrize("qtype", ["AAAA", "TXT", "MX", "NS"])
def test_other_types_of_a_broker_name_are_nodata(zone: Zone, qtype: str) -> None:
    reply = reply_to(zone, DNSRecord.question(FULL.format(1), qtype))
    assert reply.header.rcode == RCODE.NOERROR and reply.header.aa == 1 and not reply.rr
    assert soa_apex(reply) == "cluster.local"


@pytest.mark.parametrize("name", EMPTY_NON_TERMINALS)
def test_names_between_the_apex_and_the_brokers_exist(zone: Zone, name: str) -> None:
    reply = reply_to(zone, DNSRecord.question(name, "A"))
    assert reply.header.rcode == RCODE.NOERROR and reply.header.aa == 1 and not reply.rr
    assert name.endswith(soa_apex(reply))


@pytest.mark.parametrize("apex", ["cluster.local", "svc"])
def test_each_apex_answers_its_soa(zone: Zone, apex: str) -> None:
    reply = reply_to(zone, DNSRecord.question(apex, "SOA"))
    assert reply.header.rcode == RCODE.NOERROR and reply.header.aa == 1
    (soa,) = reply.rr
    assert soa.rtype == QTYPE.SOA and str(soa.rname).rstrip(".") == apex


def _edns_query(name: str, version: int = 0, do: bool = False, size: int = 4096) -> DNSRecord:
    query = DNSRecord.question(name)
    query.add_ar(EDNS0(version=version, flags="do" if do else "", udp_len=size))
    return query


def _opt(reply: DNSRecord) -> object:
    opts = [rr for rr in reply.ar if rr.rtype == QTYPE.OPT]
    assert len(opts) == 1, reply
    return opts[0]


@pytest.mark.parametrize("do", [False, True])
@pytest.mark.parametrize("name", [FULL.format(0), "nope.cluster.local", "example.com"])
def test_edns_queries_get_an_opt_record(zone: Zone, name: str, do: bool) -> None:
    reply = reply_to(zone, _edns_query(name, do=do))
    opt = _opt(reply)
    assert opt.rclass == EDNS_UDP_SIZE  # type: ignore[attr-defined]
    assert (opt.ttl >> 16) & 0xFF == 0  # type: ignore[attr-defined]  # version 0
    assert bool(opt.ttl & 0x8000) is do  # type: ignore[attr-defined]  # DO copied


def test_no_opt_without_edns(zone: Zone) -> None:
    reply = reply_to(zone, DNSRecord.question(FULL.format(0)))
    assert not [rr for rr in reply.ar if rr.rtype == QTYPE.OPT]


def test_edns_versions_above_zero_get_badvers(zone: Zone) -> None:
    reply = reply_to(zone, _edns_query(FULL.format(0), version=1))
    opt = _opt(reply)
    rcode = (opt.ttl >> 24) << 4 | reply.header.rcode  # type: ignore[attr-defined]
    assert rcode == 16 and not reply.rr  # BADVERS
    assert (opt.ttl >> 16) & 0xFF == 0  # type: ignore[attr-defined]  # the version we speak


def test_two_opt_records_are_formerr(zone: Zone) -> None:
    query = _edns_query(FULL.format(0))
    query.add_ar(EDNS0(udp_len=512))
    assert reply_to(zone, query).header.rcode == RCODE.FORMERR


@pytest.mark.parametrize(
    ("question", "authoritative"),
    [
        ((FULL.format(0), "A"), True),
        ((FULL.format(0), "AAAA"), True),
        (("nope.cluster.local", "A"), True),
        (("example.com", "A"), False),
        (("localhost", "A"), False),
    ],
)
def test_aa_only_on_answers_from_the_zone(
    zone: Zone, question: tuple[str, str], authoritative: bool
) -> None:
    reply = reply_to(zone, DNSRecord.question(*question))
    assert reply.header.aa == int(authoritative)
    assert (reply.header.rcode == RCODE.REFUSED) is not authoritative


@pytest.mark.parametrize("count", [0, 2, 3])
def test_a_question_count_other_than_one_is_formerr(zone: Zone, count: int) -> None:
    query = DNSRecord(DNSHeader(id=77, rd=1))
    for i in range(count):
        query.add_question(DNSQuestion(FULL.format(i)))
    reply = reply_to(zone, query)
    assert reply.header.rcode == RCODE.FORMERR and reply.header.aa == 0
    assert reply.header.id == 77 and not reply.rr


@pytest.mark.parametrize("opcode", ["IQUERY", "STATUS", "NOTIFY", "UPDATE", 3, 15])
def test_opcodes_other_than_query_are_notimp(zone: Zone, opcode: str | int) -> None:
    code = getattr(OPCODE, opcode) if isinstance(opcode, str) else opcode
    query = DNSRecord(DNSHeader(id=4242, opcode=code), q=DNSQuestion(FULL.format(0)))
    reply = reply_to(zone, query)
    assert reply.header.rcode == RCODE.NOTIMP and reply.header.aa == 0
    assert reply.header.opcode == code and reply.header.id == 4242 and reply.header.qr == 1


@pytest.mark.parametrize("qclass", ["CH", "Hesiod", "*"])
def test_classes_other_than_in_are_refused(zone: Zone, qclass: str) -> None:
    query = DNSRecord(q=DNSQuestion(FULL.format(0), QTYPE.A, getattr(CLASS, qclass)))
    reply = reply_to(zone, query)
    assert reply.header.rcode == RCODE.REFUSED and reply.header.aa == 0 and not reply.rr


def test_a_name_with_too_many_labels_is_formerr(zone: Zone) -> None:
    """Labels past 255 bytes of name (dnslib raises): FORMERR like every other bad packet."""
    header = bytes(DNSRecord(DNSHeader(id=9, rd=1)).pack()[:12])
    name = b"".join(b"\x01a" for _ in range(200)) + b"\x00"
    packet = header[:4] + b"\x00\x01" + header[6:] + name + b"\x00\x01\x00\x01"
    reply = reply_to(zone, packet)
    assert reply.header.rcode == RCODE.FORMERR and reply.header.id == 9


@settings(max_examples=400, deadline=None)
@given(header=st.binary(min_size=12, max_size=12), body=st.binary(max_size=300))
def test_every_query_that_does_not_parse_gets_formerr(
    zone: Zone, header: bytes, body: bytes
) -> None:
    """Any packet with a whole header that is a query gets a reply: FORMERR if it cannot be
    read, NOTIMP for other opcodes; never nothing, never an exception."""
    packet = header[:2] + bytes([header[2] & 0x7F]) + header[3:] + body
    result = respond(packet, zone)
    assert result.packet is not None
    reply = DNSRecord.parse(result.packet)
    assert reply.header.id == int.from_bytes(packet[:2], "big") and reply.header.qr == 1
    if result.problem is not None:
        assert reply.header.rcode in (RCODE.FORMERR, RCODE.NOTIMP) or (
            result.problem == "EDNS version above 0"
        )


@pytest.mark.parametrize(
    "packet", [b"", b"\x00" * 11, bytes.fromhex("1234 8180 0001 0000 0000 0000")]
)
def test_no_reply_without_a_header_or_to_a_response(zone: Zone, packet: bytes) -> None:
    result = respond(packet, zone)
    assert result.packet is None and result.problem


# -- the running shim, the log, and dig ------------------------------------------------------


@pytest.fixture
def shim(zone: Zone) -> Iterator[DnsServer]:
    loop = asyncio.new_event_loop()
    server = DnsServer(zone, "127.0.0.1", 0)
    loop.run_until_complete(server.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_a_flood_of_bad_packets_is_counted_not_logged(shim: DnsServer, tmp_path: Path) -> None:
    log_file = tmp_path / "shim.log"
    handler = logging.FileHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("kafkatunnel.dns")
    logger.addHandler(handler)
    try:
        header = bytes(DNSRecord(DNSHeader(id=1)).pack()[:12])
        too_long = header[:4] + b"\x00\x01" + header[6:] + b"\x01a" * 200 + b"\x00\x00\x01\x00\x01"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(5)
            for i in range(10_000):
                sock.sendto(too_long if i % 2 else b"\xff" * 7, ("127.0.0.1", shim.port))
                if i % 100 == 99:  # in step with the shim, so the kernel drops nothing
                    sock.sendto(DNSRecord.question(FULL.format(0)).pack(), ("127.0.0.1", shim.port))
                    while True:
                        data = sock.recv(4096)
                        if DNSRecord.parse(data).rr:
                            break
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert shim.bad_packets == 10_000
    size = log_file.stat().st_size
    assert 0 < size < 10_000, log_file.read_text()[:2000]
    assert "a" * 20 not in log_file.read_text()  # never a packet's content


def test_the_log_says_how_many_came_between_lines() -> None:
    now = [0.0]
    limited = RateLimitedLog(
        logging.getLogger("kafkatunnel.dns"),
        "DNS: %d bad packet(s) answered FORMERR/NOTIMP or dropped%s; last: %s",
        interval=10,
        clock=lambda: now[0],
    )
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("kafkatunnel.dns").addHandler(handler)
    try:
        for step in range(30):
            now[0] = step
            limited.note("malformed (DNSError)")
    finally:
        logging.getLogger("kafkatunnel.dns").removeHandler(handler)
    assert len(records) == 3
    assert records[0].startswith("DNS: 1 bad packet(s)")
    assert records[1].startswith("DNS: 10 bad packet(s)") and "in 10s" in records[1]


DIG = shutil.which("dig")


def _dig(shim: DnsServer, *args: str) -> str:
    assert DIG is not None, "dig (Debian: bind9-dnsutils) is installed by scripts/test"
    argv = [DIG, "@127.0.0.1", "-p", str(shim.port), "+norecurse", "+tries=1", "+time=3", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["nope.cluster.local"], ["status: NXDOMAIN", "flags: qr aa", "IN\tSOA\t"]),
        (["demo.svc.cluster.local"], ["status: NOERROR", "ANSWER: 0", "IN\tSOA\t"]),
        (
            ["kafka-0.kafka-headless.demo.svc", "AAAA"],
            ["status: NOERROR", "ANSWER: 0", "IN\tSOA\t"],
        ),
        (["kafka-1.kafka-headless.demo.svc.cluster.local"], ["ANSWER: 1", "127.0.0.3"]),
        (
            ["+edns=1", "+noednsneg", "kafka-0.kafka-headless.demo.svc"],
            ["status: BADVERS", "EDNS: version: 0"],
        ),
        (
            ["+dnssec", "kafka-0.kafka-headless.demo.svc"],
            ["EDNS: version: 0, flags: do; udp: 1232"],
        ),
        (["+noedns", "kafka-0.kafka-headless.demo.svc"], ["status: NOERROR"]),
        (["-c", "CH", "version.bind", "TXT"], ["status: REFUSED"]),
        (["example.com"], ["status: REFUSED", "flags: qr;"]),
        (["+opcode=notify", "kafka-0.kafka-headless.demo.svc"], ["status: NOTIMP"]),
        (["+tcp", "cluster.local", "SOA"], ["status: NOERROR", "ANSWER: 1", "IN\tSOA\t"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) and v and v[0][:1] in "+-ekdc" else None,
)
def test_dig_agrees(shim: DnsServer, args: list[str], expected: list[str]) -> None:
    out = _dig(shim, *args)
    for phrase in expected:
        assert phrase in out, (phrase, out)
    if "+noedns" in args:
        assert "OPT PSEUDOSECTION" not in out
