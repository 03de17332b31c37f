"""Answering DNS queries: every form of a broker's name in the zones, case and trailing dots,
AAAA, NXDOMAIN inside the zone, REFUSED outside, truncation (test_conformance.py: the
rest of what resolvers expect)."""

from __future__ import annotations

import pytest
from dnslib import EDNS0, QTYPE, RCODE, RR, A, DNSQuestion, DNSRecord

from kafkatunnel.dns import Zone, answer
from kafkatunnel.dns.answer import _fit, _udp_limit
from kafkatunnel.hostnames import ClusterZones
from tests.dns import names_of

pytestmark = pytest.mark.quick

FULL = "kafka-{}.kafka-headless.demo.svc.cluster.local"


@pytest.fixture
def zone() -> Zone:
    z = Zone()
    for i in range(3):
        z.add(names_of(FULL.format(i)), f"127.0.0.{2 + i}")
    return z


def ask(zone: Zone, *names: str, qtype: str = "A", udp: bool = True) -> DNSRecord:
    query = DNSRecord.question(names[0], qtype)
    for name in names[1:]:
        query.add_question(DNSQuestion(name, getattr(QTYPE, qtype)))
    raw = answer(query.pack(), zone, udp=udp)
    assert raw is not None
    reply = DNSRecord.parse(raw)
    assert reply.header.id == query.header.id and reply.header.qr == 1
    return reply


@pytest.mark.parametrize(
    "name",
    [
        "kafka-1.kafka-headless.demo.svc",
        "kafka-1.kafka-headless.demo.svc.cluster.local",
        "kafka-1.kafka-headless.demo.svc.cluster.local.",
        "KAFKA-1.Kafka-Headless.DEMO.svc.cluster.local",
    ],
)
def test_every_form_resolves(zone: Zone, name: str) -> None:
    reply = ask(zone, name)
    assert reply.header.rcode == RCODE.NOERROR
    assert [str(rr.rdata) for rr in reply.rr] == ["127.0.0.3"]
    assert reply.header.aa == 1


def test_aaaa_is_an_empty_answer(zone: Zone) -> None:
    reply = ask(zone, FULL.format(0), qtype="AAAA")
    assert reply.header.rcode == RCODE.NOERROR and reply.rr == []


@pytest.mark.parametrize(
    "name", ["kafka-7.kafka-headless.demo.svc.cluster.local", "zookeeper.demo.svc.cluster.local",
             "kafka-7.kafka-headless.demo.svc"],
)  # fmt: skip
def test_other_names_inside_the_zone_are_nxdomain(zone: Zone, name: str) -> None:
    assert ask(zone, name).header.rcode == RCODE.NXDOMAIN


def test_short_forms_are_names_of_the_hosts_file_not_of_the_shim(zone: Zone) -> None:
    """`kafka-1.kafka-headless` lies outside the zones: /etc/hosts holds it, but the shim
    answers for no domain there (the broker picked `kafka-headless`; it could as well have
    picked `corp`, and every `*.corp` name would be the shim's)."""
    assert zone.lookup("kafka-1.kafka-headless.demo") == "127.0.0.3"
    for name in ("kafka-1.kafka-headless", "kafka-1.kafka-headless.demo", "other.kafka-headless",
                 "kafka-headless", "kafka-headless.demo"):  # fmt: skip
        assert ask(zone, name).header.rcode == RCODE.REFUSED, name


@pytest.mark.parametrize("name", ["example.com", "localhost", "cluster.local.evil.com", "com"])
def test_names_outside_the_zone_are_refused(zone: Zone, name: str) -> None:
    reply = ask(zone, name)
    assert reply.header.rcode == RCODE.REFUSED and reply.rr == []
    assert reply.header.ra == 0  # and it never recurses


def test_truncation_over_udp_and_not_over_tcp(zone: Zone) -> None:
    """One question gets at most one record, so only a reply built too big is cut: the
    limit is 512 bytes without EDNS, the client's buffer (up to 1232) with it."""
    reply = DNSRecord.question(FULL.format(0)).reply()
    for _ in range(60):  # over 512 bytes, compressed
        reply.add_answer(RR(FULL.format(0), QTYPE.A, rdata=A("127.0.0.2"), ttl=5))
    cut = DNSRecord.parse(_fit(reply, _udp_limit(None)))
    assert cut.header.tc == 1 and cut.rr == []
    whole = DNSRecord.question(FULL.format(0)).reply()
    whole.rr = [RR(FULL.format(0), QTYPE.A, rdata=A("127.0.0.2"), ttl=5)] * 60
    assert len(DNSRecord.parse(_fit(whole, 65535)).rr) == 60  # over TCP
    big = DNSRecord.question(FULL.format(0))
    big.add_ar(EDNS0(udp_len=4096))
    assert _udp_limit(big.ar[0]) == 1232  # what the shim accepts, whatever the client offers


def test_garbage(zone: Zone) -> None:
    assert answer(b"", zone) is None
    assert answer(b"\x12\x34", zone) is None
    formerr = answer(b"\x12\x34\x01\x00" + b"\x00\x01" + b"\x00" * 6 + b"\xff\xff", zone)
    assert formerr is not None and formerr[:2] == b"\x12\x34"
    assert DNSRecord.parse(formerr).header.rcode == RCODE.FORMERR
    response = DNSRecord.question(FULL.format(0)).reply().pack()
    assert answer(response, zone) is None  # never answer a response (no reflection loops)


def test_strimzi_names() -> None:
    zone = Zone()
    zone.add(names_of("my-cluster-kafka-0.my-cluster-kafka-brokers.kafka.svc"), "127.0.0.2")
    for name in ("my-cluster-kafka-0.my-cluster-kafka-brokers.kafka.svc",
                 "my-cluster-kafka-0.my-cluster-kafka-brokers.kafka.svc.cluster.local",
                 "my-cluster-kafka-0.my-cluster-kafka-brokers"):  # fmt: skip
        assert zone.lookup(name) == "127.0.0.2", name


def test_a_broker_at_the_zones_apex_leaves_the_parent_domain_alone() -> None:
    """Bootstrap `kafka-1.team.mycorp.lan` (zone `team.mycorp.lan`) and a broker advertised
    as `team.mycorp.lan`: the shim answers inside `team.mycorp.lan` only. `mycorp.lan` and
    the company's other names there are not its to answer (REFUSED: a resolver asks
    elsewhere), where NXDOMAIN for `intranet.mycorp.lan` would lose them all."""
    zones = ClusterZones.of(["kafka-1.team.mycorp.lan"])
    zone = Zone()
    zone.add(zones.names_of("kafka-1.team.mycorp.lan"), "127.0.0.2")
    zone.add(zones.names_of("team.mycorp.lan"), "127.0.0.3")
    for name in ("intranet.mycorp.lan", "mycorp.lan", "lan"):
        for qtype in ("A", "SOA"):
            reply = ask(zone, name, qtype=qtype)
            said = RCODE[reply.header.rcode]
            assert said == "REFUSED" and not reply.rr, (name, qtype, said)
    for name, address in (
        ("team.mycorp.lan", "127.0.0.3"),
        ("kafka-1.team.mycorp.lan", "127.0.0.2"),
    ):
        assert [str(rr.rdata) for rr in ask(zone, name).rr] == [address], name
    assert ask(zone, "wiki.team.mycorp.lan").header.rcode == RCODE.NXDOMAIN  # inside the zone
    assert zone.apexes == {"team.mycorp.lan"}
