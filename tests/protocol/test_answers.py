"""Answers rewritten before and sent again: byte for byte what a new walk gives, with each
send's own correlation id, and never once what the mapper says of a broker has changed."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse, MetadataResponseBroker
from kio.static.primitive import i32Timedelta

import kafkatunnel.protocol.passage as passage
from kafkatunnel.protocol import (
    BrokerAddress,
    Exchange,
    RewrittenAnswers,
    UnknownBroker,
    rewrite_caps,
    rewrite_response,
)
from tests.kio_messages import encode, request_frame, response_frame

NO_TIME = i32Timedelta.parse(datetime.timedelta(0))
ASK = MetadataRequest(
    topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
)


def metadata_answer(correlation_id: int, brokers: int = 3) -> bytes:
    named = tuple(
        MetadataResponseBroker(node_id=n, host=f"kafka-{n}.kafka", port=9092, rack=None)  # type: ignore[arg-type]
        for n in range(brokers)
    )
    message = MetadataResponse(
        throttle_time=NO_TIME,
        brokers=named,
        cluster_id="c",
        controller_id=0,  # type: ignore[arg-type]
        topics=(),
    )
    return response_frame(3, 12, encode(message), correlation_id)


class Tunnel:
    """A mapper whose answers the test changes, as the registry's change."""

    def __init__(self) -> None:
        self.ports = {0: 19092, 1: 19093, 2: 19094}

    def __call__(self, address: BrokerAddress) -> tuple[str, int]:
        if address.node_id not in self.ports:
            raise UnknownBroker(address)
        return ("127.0.0.1", self.ports[address.node_id])


def ask_and_answer(exchange: Exchange, correlation_id: int) -> bytes:
    exchange.requests.feed(request_frame(ASK, correlation_id))
    fed = exchange.responses.feed(metadata_answer(correlation_id))
    assert not fed.unknown_brokers
    return b"".join(fed.out)


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many answers the Exchange walked by their schema."""
    walked: list[int] = []

    def counted(*args: object) -> object:
        walked.append(1)
        return rewrite_response(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(passage, "rewrite_response", counted)
    return walked


def test_an_answer_seen_before_is_sent_as_a_new_walk_would_give_it(walks: list[int]) -> None:
    tunnel, answers = Tunnel(), RewrittenAnswers()
    first, second = (
        Exchange(tunnel, rewrite_caps(), answers=answers),
        Exchange(tunnel, rewrite_caps(), answers=answers),
    )  # two connections of one audience
    for correlation_id, exchange in ((7, first), (8, first), (9, second)):
        sent = ask_and_answer(exchange, correlation_id)
        walked = rewrite_response(metadata_answer(correlation_id), 3, 12, tunnel).frame
        assert sent == walked and b"kafka-1.kafka" not in sent
    assert len(walks) == 1  # the second and third were found, not walked
    assert first.stats.rewritten == 2 and second.stats.rewritten == 1


def test_a_broker_mapped_elsewhere_is_walked_again(walks: list[int]) -> None:
    tunnel = Tunnel()
    exchange = Exchange(tunnel, rewrite_caps(), answers=RewrittenAnswers())
    ask_and_answer(exchange, 1)
    tunnel.ports[1] = 29093  # its listener moved
    sent = ask_and_answer(exchange, 2)
    assert (29093).to_bytes(4, "big") in sent and (19093).to_bytes(4, "big") not in sent
    assert len(walks) == 2


def test_a_broker_no_longer_known_stops_the_answer_as_before() -> None:
    tunnel = Tunnel()
    exchange = Exchange(tunnel, rewrite_caps(), answers=RewrittenAnswers())
    ask_and_answer(exchange, 1)
    del tunnel.ports[2]  # the registry no longer maps it: it must be learned first
    exchange.requests.feed(request_frame(ASK, 2))
    fed = exchange.responses.feed(metadata_answer(2))
    assert [b.node_id for b in fed.unknown_brokers] == [0, 1, 2] and fed.out == []


def test_the_store_is_bounded(walks: list[int]) -> None:
    answers = RewrittenAnswers(entries=2, largest=len(metadata_answer(1, brokers=3)))
    tunnel = Tunnel()
    exchange = Exchange(tunnel, rewrite_caps(), answers=answers)
    for correlation_id, brokers in enumerate((1, 2, 3, 1), start=1):
        exchange.requests.feed(request_frame(ASK, correlation_id))
        exchange.responses.feed(metadata_answer(correlation_id, brokers))
    assert len(answers) == 2  # the oldest (one broker) went when the third came
    assert len(walks) == 4  # so the last was walked again
    tunnel.ports[3] = 19095
    exchange.requests.feed(request_frame(ASK, 5))
    exchange.responses.feed(metadata_answer(5, brokers=4))  # larger than kept answers
    assert len(answers) == 2
