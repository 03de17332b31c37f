"""Brokers learned from the answers a connection carries: every broker an answer names has a
tunnel address before the answer is rewritten, ports follow node-id order whatever order the
answer lists brokers in, and an answer naming only known brokers is walked once."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse, MetadataResponseBroker
from kio.static.primitive import i32Timedelta

from kafkatunnel.protocol import BrokerAddress, Exchange, addresses_in, rewrite_caps
from kafkatunnel.tunnel.registry import BrokerRegistry, Endpoint
from tests.kio_messages import encode, request_frame, response_frame

pytestmark = pytest.mark.quick

BOOTSTRAP_PORT = 19092


def metadata_answer(correlation_id: int, brokers: dict[int, str]) -> bytes:
    listed = tuple(
        MetadataResponseBroker(node_id=node, host=host, port=9092, rack=None)  # type: ignore[arg-type]
        for node, host in brokers.items()
    )
    body = MetadataResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        brokers=listed,
        cluster_id="c",
        controller_id=0,  # type: ignore[arg-type]
        topics=(),
    )
    return response_frame(3, 12, encode(body), correlation_id)


def ask(correlation_id: int) -> bytes:
    request = MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    return request_frame(request, correlation_id)


class Learner:
    """A BrokerRegistry, and what was asked of it."""

    def __init__(self) -> None:
        self.created: list[Endpoint] = []
        self.registry = BrokerRegistry("127.0.0.1", BOOTSTRAP_PORT, on_new=self.created.append)
        self.lessons: list[tuple[BrokerAddress, ...]] = []

    def learn(self, addresses: tuple[BrokerAddress, ...]) -> None:
        self.lessons.append(addresses)
        self.registry.learn(addresses)


def fed(exchange: Exchange, data: bytes, learner: Learner) -> bytes:
    """Feed the answers' direction as the relay does: learn what it stops at, resume."""
    step = exchange.responses.feed(data)
    chunks = list(step.out)
    while step.unknown_brokers:
        learner.learn(step.unknown_brokers)
        step = exchange.responses.resume()
        chunks += step.out
    return b"".join(chunks)


def answer(
    exchange: Exchange, correlation_id: int, brokers: dict[int, str], learner: Learner
) -> bytes:
    exchange.requests.feed(ask(correlation_id))
    return fed(exchange, metadata_answer(correlation_id, brokers), learner)


def test_new_brokers_get_ports_in_node_id_order_before_the_answer_is_rewritten() -> None:
    learner = Learner()
    exchange = Exchange(learner.registry.map, rewrite_caps())

    out = answer(exchange, 1, {2: "kafka-2.kafka", 0: "kafka-0.kafka", 1: "kafka-1.kafka"}, learner)

    assert [e.node_id for e in learner.created] == [0, 1, 2]
    assert [e.listen_port for e in learner.created] == [19093, 19094, 19095]
    assert {(a.host, a.port) for a in addresses_in(out, 3, 12)} == {
        ("127.0.0.1", 19093),
        ("127.0.0.1", 19094),
        ("127.0.0.1", 19095),
    }
    assert exchange.stats.rewritten == 1


def test_an_answer_naming_only_known_brokers_is_not_walked_to_learn() -> None:
    learner = Learner()
    exchange = Exchange(learner.registry.map, rewrite_caps())
    brokers = {0: "kafka-0.kafka", 1: "kafka-1.kafka"}
    first = answer(exchange, 1, brokers, learner)

    again = answer(exchange, 2, brokers, learner)

    assert len(learner.lessons) == 1
    assert again[8:] == first[8:]  # the same answer but for the correlation id
    assert exchange.stats.rewritten == 2


def test_a_broker_that_moved_keeps_its_tunnel_port() -> None:
    learner = Learner()
    exchange = Exchange(learner.registry.map, rewrite_caps())
    answer(exchange, 1, {0: "kafka-0.kafka", 1: "kafka-1.kafka"}, learner)

    out = answer(exchange, 2, {0: "kafka-0.kafka", 1: "kafka-1.moved"}, learner)

    assert len(learner.lessons) == 2
    assert learner.registry.brokers[1].advertised_host == "kafka-1.moved"
    assert [e.node_id for e in learner.created] == [0, 1]  # no new endpoint
    assert {(a.node_id, a.port) for a in addresses_in(out, 3, 12)} == {(0, 19093), (1, 19094)}


def test_a_broker_joining_later_gets_the_next_port() -> None:
    learner = Learner()
    exchange = Exchange(learner.registry.map, rewrite_caps())
    answer(exchange, 1, {0: "kafka-0.kafka", 1: "kafka-1.kafka"}, learner)

    out = answer(exchange, 2, {0: "kafka-0.kafka", 1: "kafka-1.kafka", 5: "kafka-5.kafka"}, learner)

    assert [(e.node_id, e.listen_port) for e in learner.created][-1] == (5, 19095)
    assert ("127.0.0.1", 19095) in {(a.host, a.port) for a in addresses_in(out, 3, 12)}


def test_the_answers_direction_stops_at_unknown_brokers_and_resumes_in_order() -> None:
    """The protocol core does no I/O: it stops at an answer naming brokers it has no address
    for, hands them over, and keeps what came after that answer until resume()."""
    learner = Learner()
    exchange = Exchange(learner.registry.map, rewrite_caps())
    exchange.requests.feed(ask(1) + ask(2))
    first = metadata_answer(1, {0: "kafka-0.kafka"})
    second = metadata_answer(2, {0: "kafka-0.kafka", 1: "kafka-1.kafka"})

    stopped = exchange.responses.feed(first + second[:10])
    assert stopped.out == []
    assert [b.node_id for b in stopped.unknown_brokers] == [0]
    assert exchange.responses.unread == exchange.responses.awaited == 0
    still = exchange.responses.feed(second[10:])
    assert still.out == [] and still.unknown_brokers == stopped.unknown_brokers  # kept
    assert learner.created == []  # nothing learned behind the caller's back

    learner.learn(stopped.unknown_brokers)
    resumed = exchange.responses.resume()
    out = b"".join(resumed.out)
    assert [b.node_id for b in resumed.unknown_brokers] == [0, 1]
    learner.learn(resumed.unknown_brokers)
    resumed = exchange.responses.resume()
    out += b"".join(resumed.out)

    assert not resumed.unknown_brokers
    size = int.from_bytes(out[:4], "big") + 4
    assert [a.port for a in addresses_in(out[:size], 3, 12)] == [19093]
    assert sorted(a.port for a in addresses_in(out[size:], 3, 12)) == [19093, 19094]
    assert exchange.stats.rewritten == 2


def test_resuming_without_learning_is_a_bug_not_a_loop() -> None:
    learner = Learner()
    exchange = Exchange(learner.registry.map, rewrite_caps())
    exchange.requests.feed(ask(1))
    exchange.responses.feed(metadata_answer(1, {0: "kafka-0.kafka"}))

    with pytest.raises(RuntimeError, match="resumed before learning"):
        exchange.responses.resume()
