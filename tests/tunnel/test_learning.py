"""Brokers learned from the answers a connection carries: every broker an answer names has a
tunnel address before the answer is rewritten, ports follow node-id order whatever order the
answer lists brokers in, and an answer naming only known brokers is walked once."""

from __future__ import annotations

import datetime

from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse, MetadataResponseBroker
from kio.static.primitive import i32Timedelta

from kafkatunnel.protocol.passage import Exchange
from kafkatunnel.protocol.rewrite import BrokerAddress, addresses_in, rewrite_caps
from kafkatunnel.tunnel.registry import BrokerRegistry, Endpoint
from tests.kio_messages import encode, request_frame, response_frame

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


def answer(exchange: Exchange, correlation_id: int, brokers: dict[int, str]) -> bytes:
    exchange.requests.feed(ask(correlation_id))
    return b"".join(exchange.responses.feed(metadata_answer(correlation_id, brokers)))


def test_new_brokers_get_ports_in_node_id_order_before_the_answer_is_rewritten() -> None:
    learner = Learner()
    exchange = Exchange(learner.registry.map, rewrite_caps(), learn=learner.learn)

    out = answer(exchange, 1, {2: "kafka-2.kafka", 0: "kafka-0.kafka", 1: "kafka-1.kafka"})

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
    exchange = Exchange(learner.registry.map, rewrite_caps(), learn=learner.learn)
    brokers = {0: "kafka-0.kafka", 1: "kafka-1.kafka"}
    first = answer(exchange, 1, brokers)

    again = answer(exchange, 2, brokers)

    assert len(learner.lessons) == 1
    assert again[8:] == first[8:]  # the same answer but for the correlation id
    assert exchange.stats.rewritten == 2


def test_a_broker_that_moved_keeps_its_tunnel_port() -> None:
    learner = Learner()
    exchange = Exchange(learner.registry.map, rewrite_caps(), learn=learner.learn)
    answer(exchange, 1, {0: "kafka-0.kafka", 1: "kafka-1.kafka"})

    out = answer(exchange, 2, {0: "kafka-0.kafka", 1: "kafka-1.moved"})

    assert len(learner.lessons) == 2
    assert learner.registry.brokers[1].advertised_host == "kafka-1.moved"
    assert [e.node_id for e in learner.created] == [0, 1]  # no new endpoint
    assert {(a.node_id, a.port) for a in addresses_in(out, 3, 12)} == {(0, 19093), (1, 19094)}


def test_a_broker_joining_later_gets_the_next_port() -> None:
    learner = Learner()
    exchange = Exchange(learner.registry.map, rewrite_caps(), learn=learner.learn)
    answer(exchange, 1, {0: "kafka-0.kafka", 1: "kafka-1.kafka"})

    out = answer(exchange, 2, {0: "kafka-0.kafka", 1: "kafka-1.kafka", 5: "kafka-5.kafka"})

    assert [(e.node_id, e.listen_port) for e in learner.created][-1] == (5, 19095)
    assert ("127.0.0.1", 19095) in {(a.host, a.port) for a in addresses_in(out, 3, 12)}
