"""The Exchange: one connection's two directions, frame by frame. Whatever the chunking, and
whichever bytes the I/O layer takes past it unread (splice), requests come out byte for
byte, responses come out rewritten exactly where they can name a broker, and every response
finds the request it answers."""

from __future__ import annotations

import datetime
import random
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.find_coordinator.v4.response import Coordinator, FindCoordinatorResponse
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse, MetadataResponseBroker
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v9.response import ProduceResponse
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_authenticate.v2.response import SaslAuthenticateResponse
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse
from kio.static.primitive import i32Timedelta, i64Timedelta

from kafkatunnel.protocol.passage import Chunk, Direction, Exchange, FramePassed, PassThrough
from kafkatunnel.protocol.rewrite import BrokerAddress, rewrite_caps, rewrite_response
from tests.kio_messages import encode, fetch_request, request_frame, response_frame

pytestmark = pytest.mark.quick

NO_TIME = i32Timedelta.parse(datetime.timedelta(0))
# Where a stream is cut into the pieces a socket hands over (a few bytes, or many), and
# which pieces the caller leaves unread for a splice
CUTS = st.lists(st.one_of(st.integers(1, 8), st.integers(1, 70_000)), min_size=1, max_size=8)
UNREAD = st.lists(st.booleans(), min_size=1, max_size=8)


def tunnel_mapper(address: BrokerAddress) -> tuple[str, int]:
    return ("127.0.0.1", 19093 + address.node_id)


def _produce(correlation_id: int, acks: int, records: int) -> bytes:
    data = PartitionProduceData(index=0, records=random.randbytes(records))  # type: ignore[arg-type]
    message = ProduceRequest(
        transactional_id=None,
        acks=acks,  # type: ignore[arg-type]
        timeout=NO_TIME,
        topic_data=(TopicProduceData(name="t", partition_data=(data,)),),  # type: ignore[arg-type]
    )
    return request_frame(message, correlation_id)


def fed_in_pieces(sizes: list[int], cuts: list[int]) -> list[int]:
    """`sizes` cut down so that a stream fed in `cuts` takes a few thousand pieces: a large
    frame fed a few bytes at a time says no more than a smaller one (past its head, each
    piece is one more of the same), and costs seconds. Large frames still meet small pieces
    where `cuts` mixes them with large ones."""
    limit = max(20_000, int(4_000 * sum(cuts) / len(cuts)))
    return [min(size, limit) for size in sizes]


def conversation(sizes: list[int]) -> tuple[bytes, bytes, bytes]:
    """(requests, responses, responses as the client must receive them)."""
    big = iter(sizes)
    brokers = tuple(
        MetadataResponseBroker(node_id=n, host=f"kafka-{n}.kafka", port=9092, rack=None)  # type: ignore[arg-type]
        for n in range(3)
    )
    metadata = MetadataResponse(
        throttle_time=NO_TIME,
        brokers=brokers,
        cluster_id="c",
        controller_id=0,  # type: ignore[arg-type]
        topics=(),
    )
    found = Coordinator(
        key="g",
        node_id=2,  # type: ignore[arg-type]
        host="kafka-2.kafka",
        port=9092,  # type: ignore[arg-type]
        error_code=ErrorCode.none,
        error_message=None,
    )
    coordinator = FindCoordinatorResponse(throttle_time=NO_TIME, coordinators=(found,))
    produced = ProduceResponse(responses=(), throttle_time=NO_TIME)
    ask = MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    requests = [
        request_frame(ask, 1),
        fetch_request(12, 2, next(big)),
        _produce(3, acks=0, records=next(big)),  # no answer
        request_frame(FindCoordinatorRequest(key_type=0, coordinator_keys=("g",)), 4),  # type: ignore[arg-type]
        _produce(5, acks=1, records=next(big)),
    ]
    answers = [
        (3, 12, response_frame(3, 12, encode(metadata), 1)),
        (1, 12, response_frame(1, 12, random.randbytes(next(big)), 2)),  # records, unread
        (10, 4, response_frame(10, 4, encode(coordinator), 4)),
        (0, 9, response_frame(0, 9, encode(produced), 5)),
    ]
    received = b"".join(
        rewrite_response(wire, key, version, tunnel_mapper).frame if key in (3, 10) else wire
        for key, version, wire in answers
    )
    return b"".join(requests), b"".join(wire for _, _, wire in answers), received


def drive(
    direction: Direction,
    stream: bytes,
    cuts: list[int],
    unread: list[bool],
    passed: list[FramePassed] | None = None,
) -> bytes:
    """What comes out of `direction` for `stream`, fed in pieces of the sizes in `cuts`;
    where `unread` says so, bytes it lets pass unread go past it, as splice moves them.
    `passed` gets the frames the direction says passed whole."""
    out: list[Chunk] = []
    passed = [] if passed is None else passed
    position = step = 0
    while position < len(stream):
        size = cuts[step % len(cuts)]
        if unread[step % len(unread)] and direction.unread:
            size = min(size, direction.unread, len(stream) - position)
            passed.extend(direction.skip(size))
            out.append(stream[position : position + size])
        else:
            fed = direction.feed(stream[position : position + size])
            assert not fed.unknown_brokers  # the mapper knows every broker
            out.extend(fed.out)
            passed.extend(fed.frames)
        position += size
        step += 1
    direction.close()
    return b"".join(out)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300_000), min_size=4, max_size=4),
    cuts=CUTS,
    unread=UNREAD,
    records_only=st.booleans(),
)
def test_any_chunking_and_any_splicing_give_the_same_bytes(
    sizes: list[int], cuts: list[int], unread: list[bool], records_only: bool
) -> None:
    """records_only (a recording's Exchange): Produce requests and Fetch answers are walked
    as their bytes come, however they are cut, so that only their records pass unread."""
    sizes = fed_in_pieces(sizes, cuts)
    requests, responses, received = conversation(sizes)
    exchange = Exchange(tunnel_mapper, rewrite_caps(), records_only=records_only)
    exchange.observe()
    passed: list[FramePassed] = []

    assert drive(exchange.requests, requests, cuts, unread, passed) == requests
    # where the walks found each Produce's records
    found = [f.records for f in passed if f.request is not None and f.request[0].api_key == 0]
    assert len(passed) == 5  # every request, once
    produced = [sizes[1], sizes[2]]
    if records_only:  # each walked to its end, its one record set found where it lies
        assert [[end - start for start, end in r[0]] if r else None for r in found] == [
            [size] if size else [] for size in produced
        ]
    assert exchange.waiting == 4  # the acks=0 Produce expects no answer
    assert exchange.stats.requests == {3: 1, 1: 1, 0: 2, 10: 1}

    assert drive(exchange.responses, responses, cuts, unread) == received
    assert exchange.waiting == 0
    assert exchange.stats.rewritten == 2


def test_a_large_frame_may_pass_unread_after_its_head() -> None:
    requests, _, _ = conversation([200_000, 0, 0, 0])  # a Fetch request of 200 kB second
    exchange = Exchange(tunnel_mapper, rewrite_caps())
    first = int.from_bytes(requests[:4], "big") + 4
    second = int.from_bytes(requests[first : first + 4], "big") + 4

    exchange.requests.feed(requests[: first + 16_384])
    assert exchange.requests.unread == second - 16_384
    with pytest.raises(ValueError, match="only"):
        exchange.requests.skip(exchange.requests.unread + 1)
    exchange.requests.skip(second - 16_384)
    assert exchange.requests.unread == 0
    assert exchange.requests.feed(requests[first + second :]).out != []
    assert exchange.waiting == 4


def test_a_frame_to_rewrite_is_held_whole_and_awaited() -> None:
    requests, responses, _ = conversation([0, 0, 0, 0])
    exchange = Exchange(tunnel_mapper, rewrite_caps())
    exchange.requests.feed(requests)
    metadata_size = int.from_bytes(responses[:4], "big") + 4

    assert exchange.responses.feed(responses[:20]).out == []
    assert exchange.responses.unread == 0  # a Metadata answer is rewritten: none passes unread
    assert exchange.responses.awaited == metadata_size - 20
    out = exchange.responses.feed(responses[20:metadata_size]).out
    assert b"kafka-1.kafka" not in b"".join(out)
    assert exchange.responses.awaited == 0


def test_transparent_mode_lets_everything_pass_unread() -> None:
    pipe = PassThrough()
    for direction in (pipe.requests, pipe.responses):
        assert direction.unread == sys.maxsize
        assert direction.awaited == 0
        assert direction.feed(b"\x16\x03\x01 a TLS record").out == [b"\x16\x03\x01 a TLS record"]


def test_sasl_reauthentication_mid_connection_passes_unchanged_and_rewriting_goes_on() -> None:
    """KIP-368: when the session a broker granted (session_lifetime) runs out, the client
    authenticates again on the same connection, between its other requests. SaslHandshake
    v1 and SaslAuthenticate v2 pass both ways as they came, and the Metadata answers before
    and after are rewritten alike."""
    exchange = Exchange(tunnel_mapper, rewrite_caps())
    ask = MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    broker = MetadataResponseBroker(node_id=1, host="kafka-1.kafka", port=9092, rack=None)  # type: ignore[arg-type]
    metadata = encode(
        MetadataResponse(
            throttle_time=NO_TIME, brokers=(broker,), cluster_id="c",
            controller_id=1, topics=(),  # type: ignore[arg-type]
        )
    )  # fmt: skip
    granted = i64Timedelta.parse(datetime.timedelta(minutes=5))
    requests: list[bytes] = []
    answers: list[bytes] = []
    expected: list[bytes] = []
    for login in range(2):  # the first login, then the one KIP-368 asks for
        base = login * 3
        token = f"n,,n=alice,r=nonce{login}".encode()
        requests += [
            request_frame(SaslHandshakeRequest(mechanism="SCRAM-SHA-512"), base + 1),
            request_frame(SaslAuthenticateRequest(auth_bytes=token), base + 2),
            request_frame(ask, base + 3),
        ]
        handshake = SaslHandshakeResponse(error_code=ErrorCode.none, mechanisms=("SCRAM-SHA-512",))
        authenticated = SaslAuthenticateResponse(
            error_code=ErrorCode.none, error_message=None, auth_bytes=b"r=nonce,s=c2FsdA==,i=8192",
            session_lifetime=granted,
        )  # fmt: skip
        answered = [
            response_frame(17, 1, encode(handshake), base + 1),
            response_frame(36, 2, encode(authenticated), base + 2),
            response_frame(3, 12, metadata, base + 3),
        ]
        answers += answered
        expected += [*answered[:2], rewrite_response(answered[2], 3, 12, tunnel_mapper).frame]
    sent = b"".join(bytes(c) for r in requests for c in exchange.requests.feed(r).out)
    assert sent == b"".join(requests)
    received = b"".join(bytes(c) for a in answers for c in exchange.responses.feed(a).out)
    assert received == b"".join(expected)
    assert b"127.0.0.1" in expected[-1] and b"kafka-1.kafka" not in expected[-1]


def frame_ends(stream: bytes) -> set[int]:
    """Where each frame of `stream` ends."""
    ends, at = set(), 0
    while at < len(stream):
        at += 4 + int.from_bytes(stream[at : at + 4], "big")
        ends.add(at)
    return ends


@settings(max_examples=120, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 100_000), min_size=4, max_size=4),
    cuts=CUTS,
    unread=UNREAD,
    pause_after=st.integers(0, 12),
    records_only=st.booleans(),
)
def test_paused_requests_stop_at_the_end_of_the_frame_in_progress_and_go_on_whole(
    sizes: list[int], cuts: list[int], unread: list[bool], pause_after: int, records_only: bool
) -> None:
    """The tunnel's re-authentication holds the client's requests between two frames: what
    passes once paused ends where a frame ends, nothing more passes (nor may pass unread)
    however the client's bytes come, and after it the held bytes pass as they were."""
    requests, _, _ = conversation(fed_in_pieces(sizes, cuts))
    exchange = Exchange(tunnel_mapper, rewrite_caps(), records_only=records_only)
    direction = exchange.requests
    out: list[Chunk] = []
    position = step = 0
    paused_at = None
    while position < len(requests):
        if step == pause_after:
            exchange.pause_requests()
            paused_at = position
        size = cuts[step % len(cuts)]
        if unread[step % len(unread)] and direction.unread:
            size = min(size, direction.unread, len(requests) - position)
            direction.skip(size)
            out.append(requests[position : position + size])
        else:
            out.extend(direction.feed(requests[position : position + size]).out)
        position += size
        step += 1
    passed = b"".join(out)
    assert requests.startswith(passed)
    if paused_at is not None:
        assert direction.paused and direction.unread == 0 and direction.awaited == 0
        # the frame in progress when paused went on whole, and nothing after it
        assert len(passed) == min(end for end in frame_ends(requests) | {0} if end >= paused_at)
    rest = b"".join(exchange.unpause_requests().out)
    assert passed + rest == requests
    assert not direction.paused
    direction.close()
    assert exchange.waiting == 4  # every request observed once (the acks=0 Produce unanswered)


def test_a_pause_between_frames_holds_everything_that_comes_next() -> None:
    requests, _, _ = conversation([10, 10, 10, 10])
    exchange = Exchange(tunnel_mapper, rewrite_caps())
    first = int.from_bytes(requests[:4], "big") + 4
    assert b"".join(exchange.requests.feed(requests[:first]).out) == requests[:first]
    exchange.pause_requests()
    assert exchange.requests.paused
    assert exchange.requests.feed(requests[first:]).out == []
    assert exchange.waiting == 1  # the held requests are not yet observed either
    assert b"".join(exchange.unpause_requests().out) == requests[first:]
    assert exchange.waiting == 4
