"""Answers rewritten before and sent again: byte for byte what a new walk gives, with each
send's own correlation id, and never once what the mapper says of a broker has changed."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from kio.schema.describe_cluster.v1.request import DescribeClusterRequest
from kio.schema.describe_cluster.v1.response import DescribeClusterBroker, DescribeClusterResponse
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.find_coordinator.v4.response import Coordinator, FindCoordinatorResponse
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse, MetadataResponseBroker
from kio.schema.produce.v11 import request as produce_request
from kio.schema.produce.v11 import response as produce_response
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

pytestmark = pytest.mark.quick

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
    """The answers the Exchange walked by their schema."""
    walked: list[int] = []  # the API key of each

    def counted(frame: bytes, api_key: int, *args: Any) -> object:
        walked.append(api_key)
        return rewrite_response(frame, api_key, *args)

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
    for correlation_id in (5, 6):  # larger than kept answers: walked each time it comes
        exchange.requests.feed(request_frame(ASK, correlation_id))
        answer = metadata_answer(correlation_id, brokers=4)
        fed = exchange.responses.feed(answer)
        assert b"".join(fed.out) == rewrite_response(answer, 3, 12, tunnel).frame
    assert len(answers) == 2
    assert len(walks) == 6


def test_an_unchanged_answer_sent_twice_carries_each_requests_own_correlation_id(
    walks: list[int],
) -> None:
    exchange = Exchange(lambda address: None, rewrite_caps(), answers=RewrittenAnswers())
    for correlation_id in (3, 4):  # a mapper that leaves every address as it is
        exchange.requests.feed(request_frame(ASK, correlation_id))
        fed = exchange.responses.feed(metadata_answer(correlation_id))
        assert b"".join(fed.out) == metadata_answer(correlation_id)
    assert len(walks) == 1 and exchange.stats.rewritten == 0


def test_an_answer_sent_again_is_the_last_to_go(walks: list[int]) -> None:
    answers = RewrittenAnswers(entries=2)
    tunnel = Tunnel()
    exchange = Exchange(tunnel, rewrite_caps(), answers=answers)
    # one broker, two, one again (found), three: the two-broker answer goes, not the one
    # sent a moment ago, which is found once more
    for correlation_id, brokers in enumerate((1, 2, 1, 3, 1), start=1):
        exchange.requests.feed(request_frame(ASK, correlation_id))
        answer = metadata_answer(correlation_id, brokers)
        fed = exchange.responses.feed(answer)
        assert b"".join(fed.out) == rewrite_response(answer, 3, 12, tunnel).frame
    assert len(walks) == 3


def produce_answer(correlation_id: int, offset: int) -> bytes:
    """A Produce v11 answer: a leader moved to broker 2, whose address it names."""
    partition = produce_response.PartitionProduceResponse(
        index=0,  # type: ignore[arg-type]
        error_code=ErrorCode.not_leader_or_follower,
        base_offset=offset,  # type: ignore[arg-type]
        record_errors=(),
        current_leader=produce_response.LeaderIdAndEpoch(leader_id=2, leader_epoch=1),  # type: ignore[arg-type]
    )
    topic = produce_response.TopicProduceResponse(name="t", partition_responses=(partition,))  # type: ignore[arg-type]
    leader = produce_response.NodeEndpoint(node_id=2, host="kafka-2.kafka", port=9092)  # type: ignore[arg-type]
    message = produce_response.ProduceResponse(
        responses=(topic,), throttle_time=NO_TIME, node_endpoints=(leader,)
    )
    return response_frame(0, 11, encode(message), correlation_id)


PRODUCE = produce_request.ProduceRequest(
    acks=1,  # type: ignore[arg-type]
    timeout=NO_TIME,
    topic_data=(produce_request.TopicProduceData(
        name="t", partition_data=(produce_request.PartitionProduceData(index=0, records=b"r"),),  # type: ignore[arg-type]
    ),),
)  # fmt: skip


def test_answers_that_never_repeat_push_out_none_that_do(walks: list[int]) -> None:
    answers = RewrittenAnswers()
    tunnel = Tunnel()
    exchange = Exchange(tunnel, rewrite_caps(), answers=answers)
    ask_and_answer(exchange, 1)
    for correlation_id in range(2, 2 + answers.entries):  # a producer's answers: each new
        exchange.requests.feed(request_frame(PRODUCE, correlation_id))
        fed = exchange.responses.feed(produce_answer(correlation_id, offset=correlation_id))
        assert b"kafka-2.kafka" not in b"".join(fed.out)
    assert len(answers) == 1
    sent = ask_and_answer(exchange, 1000)  # the next refresh
    assert sent == rewrite_response(metadata_answer(1000), 3, 12, tunnel).frame
    assert walks.count(3) == 1 and walks.count(0) == answers.entries


def coordinator_answer(correlation_id: int) -> bytes:
    found = Coordinator(
        key="g", node_id=2, host="kafka-2.kafka", port=9092, error_code=ErrorCode.none,  # type: ignore[arg-type]
        error_message=None,
    )  # fmt: skip
    message = FindCoordinatorResponse(throttle_time=NO_TIME, coordinators=(found,))
    return response_frame(10, 4, encode(message), correlation_id)


def cluster_answer(correlation_id: int) -> bytes:
    broker = DescribeClusterBroker(broker_id=1, host="kafka-1.kafka", port=9092)  # type: ignore[arg-type]
    message = DescribeClusterResponse(
        throttle_time=NO_TIME, error_code=ErrorCode.none, cluster_id="c", brokers=(broker,)
    )
    return response_frame(60, 1, encode(message), correlation_id)


@pytest.mark.parametrize(
    ("ask", "answer"),
    [
        (ASK, metadata_answer),
        (FindCoordinatorRequest(key_type=0, coordinator_keys=("g",)), coordinator_answer),  # type: ignore[arg-type]
        (DescribeClusterRequest(include_cluster_authorized_operations=False), cluster_answer),
    ],
    ids=["Metadata", "FindCoordinator", "DescribeCluster"],
)
def test_every_api_whose_answers_repeat_is_answered_from_the_store(
    walks: list[int], ask: Any, answer: Any
) -> None:
    tunnel, api_key, version = Tunnel(), int(ask.__api_key__), int(ask.__version__)
    exchange = Exchange(tunnel, rewrite_caps(), answers=RewrittenAnswers())
    for correlation_id in (1, 2):
        exchange.requests.feed(request_frame(ask, correlation_id))
        fed = exchange.responses.feed(answer(correlation_id))
        walked = rewrite_response(answer(correlation_id), api_key, version, tunnel)
        assert b"".join(fed.out) == walked.frame and walked.changed
    assert walks == [api_key]  # the second was found
