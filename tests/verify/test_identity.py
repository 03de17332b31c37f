"""Which broker is behind each captured address: each kind of evidence alone, their order,
conflicts, ambiguity, and the sightings one group's events give."""

from __future__ import annotations

import pytest

from kafkatunnel.verify.calls import Conn
from kafkatunnel.verify.events import CALL, LOOKUP, Event
from kafkatunnel.verify.identity import (
    ADVERTISED,
    BEHAVIOUR,
    DNS,
    RECORDING,
    USER,
    Sighting,
    identify,
    resolved,
    sightings_of,
)
from kafkatunnel.verify.resolutions import DnsAnswer

pytestmark = pytest.mark.quick

NAME = "kafka-1.kafka-headless.shop.svc.cluster.local"
RELAY = "127.0.0.3:9092"


def _seen(conn: str, node: int, answered: int = 1, denied: int = 0, ts: int = 1,
          server: str = RELAY) -> Sighting:  # fmt: skip
    return Sighting(conn, server, ts, node, answered, denied)


def test_nothing_known_is_not_identified() -> None:
    found = identify([RELAY]).addresses[RELAY]
    assert (found.node, found.method, found.evidence) == (None, None, {})


def test_each_kind_of_evidence_alone() -> None:
    assert identify([RELAY], recorded={RELAY: 1}).addresses[RELAY].method == RECORDING
    advertised = identify([RELAY], advertised=[(2, RELAY)]).addresses[RELAY]
    assert (advertised.node, advertised.method) == (2, ADVERTISED)
    dns = identify([RELAY], advertised=[(3, f"{NAME}:9092")],
                   dns=[DnsAnswer(0, NAME, "127.0.0.3")]).addresses[RELAY]  # fmt: skip
    assert (dns.node, dns.method) == (3, DNS)
    seen = identify([RELAY], sightings=[_seen("c1", 4)]).addresses[RELAY]
    assert (seen.node, seen.method, seen.evidence) == (4, BEHAVIOUR, {BEHAVIOUR: 1})
    user = identify([RELAY], user={RELAY: 5}).addresses[RELAY]
    assert (user.node, user.method) == (5, USER)


def test_dns_follows_cname_chains_and_needs_the_advertised_port() -> None:
    answers = [DnsAnswer(0, NAME, "lb.example"), DnsAnswer(0, "lb.example", "edge.example"),
               DnsAnswer(0, "edge.example", "127.0.0.3")]  # fmt: skip
    assert resolved(answers)[NAME] == {"127.0.0.3"}
    found = identify([RELAY, "127.0.0.3:9093"], advertised=[(1, f"{NAME}:9092")], dns=answers)
    assert found.addresses[RELAY].node == 1
    assert found.addresses["127.0.0.3:9093"].node is None


def test_the_user_wins_and_recordings_beat_the_rest() -> None:
    everything = dict(advertised=[(2, RELAY)], sightings=[_seen("c1", 3)], recorded={RELAY: 1})
    assert identify([RELAY], **everything).addresses[RELAY].node == 1  # type: ignore[arg-type]
    found = identify([RELAY], user={RELAY: 9}, **everything).addresses[RELAY]  # type: ignore[arg-type]
    assert (found.node, found.method) == (9, USER)
    assert found.evidence == {RECORDING: 1, ADVERTISED: 1, BEHAVIOUR: 1}


def test_behaviour_that_contradicts_an_advertised_address_wins_and_says_so() -> None:
    """One relay on every advertised address: broker 1's address answers as broker 0."""
    found = identify([RELAY], advertised=[(1, RELAY)], sightings=[_seen("c1", 0)])
    identity = found.addresses[RELAY]
    assert (identity.node, identity.method) == (0, BEHAVIOUR)
    assert identity.note == "advertised evidence says broker 1, but it answers as broker 0"


def test_denials_alone_identify_nothing_and_say_who_it_is_not() -> None:
    found = identify([RELAY], sightings=[_seen("c1", 2, answered=0, denied=4)])
    identity = found.addresses[RELAY]
    assert identity.node is None and not identity.ambiguous
    assert identity.note == "answered NOT_COORDINATOR for keys broker 2 coordinates"


def test_denials_of_the_advertised_broker_say_the_address_leads_elsewhere() -> None:
    """The single port-forward failure with brokers that advertise addresses: broker 1's
    address is advertised, and answers NOT_COORDINATOR for everything broker 1 coordinates."""
    found = identify([RELAY], advertised=[(1, RELAY)], sightings=[_seen("c1", 1, 0, 3)])
    identity = found.addresses[RELAY]
    assert (identity.node, identity.method) == (1, ADVERTISED)
    assert identity.note == ("answered NOT_COORDINATOR for keys broker 1 coordinates: it does "
                             "not lead to broker 1")  # fmt: skip


def test_two_brokers_behind_one_address_is_ambiguous_per_connection() -> None:
    sightings = [_seen("c1", 1, ts=10), _seen("c2", 2, ts=20), _seen("c3", 1, ts=30)]
    found = identify([RELAY], sightings=sightings)
    identity = found.addresses[RELAY]
    assert identity.ambiguous and identity.changes == [(10, 1), (20, 2), (30, 1)]
    assert [found.node_of(c, RELAY) for c in ("c1", "c2", "c3", "c4")] == [1, 2, 1, None]


def test_a_connection_denying_the_broker_others_answered_as_makes_it_ambiguous() -> None:
    """A relay that alternates, seen only by one broker's groups: one connection answered
    as broker 1, another said NOT_COORDINATOR for the keys broker 1 coordinates."""
    sightings = [_seen("c1", 1, ts=10), _seen("c2", 1, answered=0, denied=3, ts=20)]
    found = identify([RELAY], sightings=sightings)
    identity = found.addresses[RELAY]
    assert identity.ambiguous and identity.changes == [(10, 1), (20, None)]
    assert (found.node_of("c1", RELAY), found.node_of("c2", RELAY)) == (1, None)
    assert identity.note is not None and "as another" in identity.note


def test_a_transient_denial_then_answers_is_not_ambiguous() -> None:
    sightings = [_seen("c1", 1, answered=5, denied=1), _seen("c2", 1)]
    identity = identify([RELAY], sightings=sightings).addresses[RELAY]
    assert not identity.ambiguous and identity.node == 1


def test_addresses_compare_in_one_spelling() -> None:
    spellings = ["::ffff:127.0.0.3:9092", "KAFKA-1.Example.:9092"]
    found = identify(
        spellings, user={"127.0.0.3:9092": 1}, advertised=[(2, "kafka-1.example:9092")]
    )
    assert found.addresses["127.0.0.3:9092"].node == 1
    assert found.addresses["kafka-1.example:9092"].node == 2
    assert found.node_of("c", "::ffff:127.0.0.3:9092") == 1


def _event(kind: str, ts: int, conn: str, error: int | None, node: int | None = None) -> Event:
    where = Conn(conn, "10.0.0.1:5000", RELAY, None, False)
    return Event(kind, ts, where, 10 if kind == LOOKUP else 11, "g", 0, error, node)


def test_sightings_of_a_group_follow_the_lookup_in_force() -> None:
    events = [
        _event(CALL, 1, "c0", 0),  # before any lookup: says nothing
        _event(LOOKUP, 2, "c9", 0, node=1),
        _event(CALL, 3, "c1", 0),
        _event(CALL, 4, "c1", 27),  # REBALANCE_IN_PROGRESS comes from the coordinator too
        _event(CALL, 5, "c2", 16),  # NOT_COORDINATOR
        _event(CALL, 6, "c2", 15),  # COORDINATOR_NOT_AVAILABLE: says nothing
        _event(LOOKUP, 7, "c9", 0, node=2),
        _event(CALL, 8, "c1", 0),
    ]
    assert sorted(sightings_of(events)) == [
        Sighting("c1", RELAY, 3, 1, 2, 0),
        Sighting("c1", RELAY, 8, 2, 1, 0),
        Sighting("c2", RELAY, 5, 1, 0, 1),
    ]
