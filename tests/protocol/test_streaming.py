"""Fetch answers that can name brokers (v16+) rewritten as they stream: the record batches
pass unread, the answer keeps its length, and the client decodes exactly the answer with
tunnel addresses (or, when those would not fit, without the NodeEndpoints hint), whatever
the chunking and whichever bytes go past unread."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v16.response import (
    FetchableTopicResponse,
    FetchResponse,
    LeaderIdAndEpoch,
    NodeEndpoint,
    PartitionData,
)
from kio.static.primitive import i32Timedelta

from kafkatunnel.protocol import wire
from kafkatunnel.protocol.errors import ProtocolError
from kafkatunnel.protocol.passage import Exchange
from kafkatunnel.protocol.rewrite import BrokerAddress, rewrite_caps
from kafkatunnel.protocol.streaming import PADDING_TAGS, streamable
from tests.kio_messages import (
    decode,
    encode,
    fetch_request,
    map_addresses,
    response_body,
    response_frame,
    responses,
)
from tests.protocol.test_passage import drive

pytestmark = pytest.mark.quick

FETCH = 1
STREAMED = [v for v in range(19) if streamable(FETCH, v) is not None]
RECORDS_MARK = bytes(range(1, 40))  # where a test answer's records begin


def tunnel(address: BrokerAddress) -> tuple[str, int]:
    return ("127.0.0.1", 19093 + address.node_id % 1000)


def through(version: int, answer: bytes, cuts: list[int], unread: list[bool]) -> bytes:
    exchange = Exchange(tunnel, rewrite_caps())
    exchange.requests.feed(fetch_request(version, 7))
    out = drive(exchange.responses, answer, cuts, unread)
    assert exchange.waiting == 0
    return out


def client_decode(message: Any, out: bytes, version: int) -> Any:
    """Decode `out` as a client does: skipping unknown tagged fields (Kafka's clients keep
    or skip them; kio refuses them, so padding is taken out first, checked to be zeros)."""
    without = dataclasses.replace(message, node_endpoints=())
    tail_size = len(encode(message)) - len(encode(without)) + 1  # +1: the tag count
    body, tail = out[:-tail_size], out[-tail_size:]
    kept = []
    end = wire.read_uvarint(tail, 0)[1]  # where the fields end if there are none
    for field in wire.tagged_fields(tail, 0):
        if field.tag in PADDING_TAGS:
            assert tail[field.data : field.end] == bytes(field.end - field.data)
        else:
            kept.append(tail[field.start : field.end])
        end = field.end
    assert end == len(tail)
    tagged = wire.write_uvarint(len(kept)) + b"".join(kept)
    return decode(type(message), response_body(FETCH, version, body + tagged))


def expected(message: Any) -> Any:
    """The answer as the client must decode it: tunnel addresses, or no NodeEndpoints when
    they would not fit in the bytes the broker's took (the size prefix went first)."""
    mapped = map_addresses(message, tunnel, [])
    grown = len(encode(mapped)) - len(encode(message))
    if grown == 0 or grown <= -3:  # the same length, or room for a padding field
        return mapped
    return dataclasses.replace(mapped, node_endpoints=())


def test_fetch_answers_from_v16_on_are_streamed_and_older_ones_pass_whole() -> None:
    assert STREAMED == [16, 17, 18]


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    version=st.sampled_from(STREAMED),
    cuts=st.lists(st.integers(1, 300), min_size=1, max_size=6),
    unread=st.lists(st.booleans(), min_size=1, max_size=6),
)
def test_any_fetch_answer_streams_to_what_the_client_must_decode(
    data: st.DataObject, version: int, cuts: list[int], unread: list[bool]
) -> None:
    message = data.draw(responses(FETCH, version))
    answer = response_frame(FETCH, version, encode(message), 7)

    out = through(version, answer, cuts, unread)

    assert len(out) == len(answer)
    assert client_decode(message, out, version) == expected(message)


@pytest.mark.parametrize("host", ["kafka-0.kafka-headless.ns.svc.cluster.local", "10.0.0.5"])
def test_node_endpoints_are_rewritten_or_dropped_never_leaked(host: str) -> None:
    message = _answer_with_endpoint(host)
    answer = response_frame(FETCH, 16, encode(message), 7)

    out = through(16, answer, [1000], [True])

    decoded = client_decode(message, out, 16)
    assert host.encode() not in out
    if len(host) > len("127.0.0.1") + 2:  # room for the tunnel address and padding
        assert [(e.host, e.port) for e in decoded.node_endpoints] == [("127.0.0.1", 19093)]
    else:
        assert decoded.node_endpoints == ()  # the client asks Metadata, as before KIP-951
    assert decoded.responses == message.responses


def test_records_pass_unread() -> None:
    message = _answer_with_endpoint("kafka-0.kafka-headless.ns.svc.cluster.local", 200_000)
    answer = response_frame(FETCH, 16, encode(message), 7)
    exchange = Exchange(tunnel, rewrite_caps())
    exchange.requests.feed(fetch_request(16, 7))

    exchange.responses.feed(answer[:4096])

    assert exchange.responses.unread > 190_000
    exchange.responses.skip(exchange.responses.unread)
    rest = exchange.responses.feed(answer[4096 + 200_000 - (4096 - _records_start(answer)) :])
    assert b"127.0.0.1" in b"".join(rest.out)
    assert exchange.waiting == 0


def test_records_longer_than_their_frame_end_the_connection() -> None:
    message = _answer_with_endpoint("kafka-0.kafka", 1000)
    answer = bytearray(response_frame(FETCH, 16, encode(message), 7))
    start = _records_start(bytes(answer))
    answer[start - 2 : start] = bytes([0x80 | 0x7F, 0x7F])  # records length: 16,383 - 1
    exchange = Exchange(tunnel, rewrite_caps())
    exchange.requests.feed(fetch_request(16, 7))

    with pytest.raises(ProtocolError, match="past the end"):
        exchange.responses.feed(bytes(answer))


def _answer_with_endpoint(host: str, records: int = 100) -> FetchResponse:
    """A Fetch v16 answer: one partition whose leader moved to node 0 (at `host`)."""
    partition = PartitionData(
        partition_index=0,  # type: ignore[arg-type]
        error_code=ErrorCode.not_leader_or_follower,
        high_watermark=0,  # type: ignore[arg-type]
        current_leader=LeaderIdAndEpoch(leader_id=0, leader_epoch=5),  # type: ignore[arg-type]
        aborted_transactions=(),
        records=RECORDS_MARK + bytes(records - len(RECORDS_MARK)),  # type: ignore[arg-type]
    )
    return FetchResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        error_code=ErrorCode.none,
        responses=(FetchableTopicResponse(topic_id=uuid.uuid4(), partitions=(partition,)),),
        node_endpoints=(NodeEndpoint(node_id=0, host=host, port=9092, rack=None),),  # type: ignore[arg-type]
    )


def _records_start(answer: bytes) -> int:
    return answer.index(RECORDS_MARK)
