"""An Exchange with a Policy: a refused request never goes upstream (an ApiVersions v0 with
its correlation id goes in its place), and its refusal reaches the client exactly where the
broker's answer to it would have: after the answers to every earlier request, before the
later ones, whatever the chunking and whatever passes unread. Everything allowed passes
byte for byte."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.api_versions.v0.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.find_coordinator.v4.response import Coordinator, FindCoordinatorResponse
from kio.schema.index import api_key_map, schema_name_map

from kafkatunnel.protocol import (
    Exchange,
    FrameDecoder,
    FramePassed,
    Policy,
    RefusedUnanswerable,
    frame,
    parse_request_header,
    refusal,
    rewrite_response,
)
from kafkatunnel.protocol.policy import EPOCH_HEARTBEATS, NOTED
from kafkatunnel.protocol.rewrite import rewrite_caps
from tests.kio_messages import encode, fetch_request, request_frame, response_frame
from tests.protocol.requests_built import built
from tests.protocol.test_passage import CUTS, NO_TIME, UNREAD, drive, tunnel_mapper
from tests.protocol.test_policy import DECIDED, READS

pytestmark = pytest.mark.quick

READ_ONLY = Policy.of(read_only=True)
assert READ_ONLY is not None
REASON = READ_ONLY.reason
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36


def _stand_in(wire: bytes) -> tuple[int, int, int]:
    header = parse_request_header(wire)
    return header.api_key, header.api_version, header.correlation_id


def _api_versions_answer(correlation_id: int) -> bytes:
    listed = ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=(ApiVersion(api_key=0, min_version=3, max_version=12),),  # type: ignore[arg-type]
    )
    return response_frame(API_VERSIONS, 0, encode(listed), correlation_id)


def _found(correlation_id: int) -> bytes:
    found = Coordinator(
        key="g", node_id=2, host="kafka-2.kafka", port=9092,  # type: ignore[arg-type]
        error_code=ErrorCode.none, error_message=None,
    )  # fmt: skip
    body = encode(FindCoordinatorResponse(throttle_time=NO_TIME, coordinators=(found,)))
    return response_frame(10, 4, body, correlation_id)


def _conversation(fetch_size: int) -> tuple[list[bytes], list[bool], list[bytes], list[bytes]]:
    """(requests, which are refused, the broker's answers to what went upstream, what the
    client must receive)."""
    commit_by_member = built(8, 9, member_id="m-1", generation_id_or_member_epoch=3)
    commit_by_admin = built(8, 9, member_id="", generation_id_or_member_epoch=-1)
    requests = [
        fetch_request(12, 1, 40),
        request_frame(built(20, 6), 2),  # DeleteTopics
        request_frame(built(0, 9, acks=-1), 3),  # Produce
        request_frame(FindCoordinatorRequest(key_type=0, coordinator_keys=("g",)), 4),  # type: ignore[arg-type]
        request_frame(built(19, 7), 5),  # CreateTopics
        request_frame(commit_by_admin, 6),
        request_frame(commit_by_member, 7),
    ]
    refused = [False, True, True, False, True, True, False]
    committed = response_frame(8, 9, random.randbytes(30), 7)
    fetched = response_frame(1, 12, random.randbytes(fetch_size), 1)
    broker = [
        fetched,
        _api_versions_answer(2),
        _api_versions_answer(3),
        _found(4),
        _api_versions_answer(5),
        _api_versions_answer(6),
        committed,
    ]
    received = [
        fetched,
        refusal(requests[1], parse_request_header(requests[1]), REASON),
        refusal(requests[2], parse_request_header(requests[2]), REASON),
        rewrite_response(_found(4), 10, 4, tunnel_mapper).frame,
        refusal(requests[4], parse_request_header(requests[4]), REASON),
        refusal(requests[5], parse_request_header(requests[5]), REASON),
        committed,
    ]
    return requests, refused, broker, received


@settings(max_examples=150, deadline=None)
@given(
    fetch_size=st.integers(0, 200_000),
    cuts=CUTS,
    unread=UNREAD,
    records_only=st.booleans(),
)
def test_refusals_come_in_order_with_the_answers_to_earlier_and_later_requests(
    fetch_size: int, cuts: list[int], unread: list[bool], records_only: bool
) -> None:
    requests, refused, broker, received = _conversation(fetch_size)
    exchange = Exchange(tunnel_mapper, rewrite_caps(), records_only=records_only, policy=READ_ONLY)

    upstream = drive(exchange.requests, b"".join(requests), cuts, unread)
    client = drive(exchange.responses, b"".join(broker), cuts, unread)

    went = FrameDecoder().feed(upstream)
    assert len(went) == len(requests)
    for wire, sent, no in zip(requests, went, refused, strict=True):
        if no:  # never upstream: a stand-in with its correlation id instead
            assert _stand_in(sent) == (API_VERSIONS, 0, _stand_in(wire)[2])
        else:
            assert sent == wire
    assert client == b"".join(received)
    assert exchange.answered
    assert exchange.stats.refused == {20: 1, 0: 1, 19: 1, 8: 1}


def test_a_refused_request_with_nothing_in_flight_goes_on_at_once() -> None:
    """Its stand-in leaves in the very call that read it; the broker answers at once."""
    exchange = Exchange(tunnel_mapper, rewrite_caps(), policy=READ_ONLY)
    wire = request_frame(built(42, 2), 9)  # DeleteGroups
    fed = exchange.requests.feed(wire)
    assert _stand_in(b"".join(bytes(c) for c in fed.out)) == (API_VERSIONS, 0, 9)
    assert [h.api_key for h in fed.refused] == [42]
    answer = exchange.responses.feed(_api_versions_answer(9))
    refused = refusal(wire, parse_request_header(wire), REASON)
    assert b"".join(bytes(c) for c in answer.out) == refused


def test_a_recording_sees_the_refused_request_and_the_tunnels_answer() -> None:
    exchange = Exchange(tunnel_mapper, rewrite_caps(), policy=READ_ONLY)
    exchange.observe()
    wire = request_frame(built(20, 6), 9)
    requests = exchange.requests.feed(wire).frames
    responses = exchange.responses.feed(_api_versions_answer(9)).frames
    assert [_joined(f) for f in requests] == [wire]
    assert [f.request[0].api_key for f in requests if f.request] == [20]
    refused = refusal(wire, parse_request_header(wire), REASON)
    assert [_joined(f) for f in responses] == [refused]


def _joined(passed: FramePassed) -> bytes:
    return b"".join(bytes(p) for p in passed.parts if not isinstance(p, int))


def test_a_produce_that_wants_no_answer_ends_the_connection_after_what_came_before() -> None:
    """acks=0: Kafka's broker closes the connection on an error it cannot answer, so the
    producer notices; the tunnel does the same."""
    exchange = Exchange(tunnel_mapper, rewrite_caps(), policy=READ_ONLY)
    before = fetch_request(12, 1, 40)
    with pytest.raises(RefusedUnanswerable, match="acks=0"):
        exchange.requests.feed(before + request_frame(built(0, 9, acks=0), 2))
    assert b"".join(bytes(c) for c in exchange.requests.taken_before_error().out) == before
    assert exchange.stats.refused == {0: 1}


def test_an_api_read_only_does_not_know_ends_the_connection() -> None:
    """It could change anything, and no refusal can be built for it: the connection ends,
    as Kafka's broker ends it on a request it cannot answer."""
    exchange = Exchange(tunnel_mapper, rewrite_caps(), policy=READ_ONLY)
    unknown = frame(struct.pack(">hhih", 7, 3, 1, -1) + b"\x00" * 8)  # ControlledShutdown v3
    with pytest.raises(RefusedUnanswerable, match="API 7"):
        exchange.requests.feed(unknown)
    lenient = Exchange(tunnel_mapper, rewrite_caps(), policy=Policy.of(deny=["DeleteTopics"]))
    assert b"".join(bytes(c) for c in lenient.requests.feed(unknown).out) == unknown


@pytest.mark.parametrize("version", range(4, 14))
def test_read_only_takes_from_metadata_requests_the_permission_to_create_topics(
    version: int,
) -> None:
    """Brokers create a topic a Metadata request names when it allows them to (and their
    auto.create.topics.enable is on, the default): through read-only it does not."""
    exchange = Exchange(tunnel_mapper, rewrite_caps(), policy=READ_ONLY)
    asking = request_frame(built(3, version, allow_auto_topic_creation=True), 1)
    plain = request_frame(built(3, version, allow_auto_topic_creation=False), 2)
    out = exchange.requests.feed(asking + plain).out
    went = FrameDecoder().feed(b"".join(bytes(c) for c in out))
    assert went == [request_frame(built(3, version, allow_auto_topic_creation=False), 1), plain]
    assert exchange.stats.refused == {}
    untouched = Exchange(tunnel_mapper, rewrite_caps(), policy=Policy.of(deny=["DeleteTopics"]))
    assert b"".join(bytes(c) for c in untouched.requests.feed(asking).out) == asking


ALL = [(k, v) for k, n in api_key_map.items() for v in sorted(schema_name_map[n])]


def given_topology(version: int) -> object:
    """A StreamsGroupHeartbeat's topology, as built (filled)."""
    return built(88, version).topology


@st.composite
def _requests(draw: st.DrawFn) -> list[tuple[bytes, int, bool]]:
    """(frame, API key, whether it changes what read-only keeps although its API may pass)"""
    chosen = draw(st.lists(st.sampled_from(ALL), min_size=1, max_size=12))
    frames = []
    for correlation_id, (key, version) in enumerate(chosen):
        given: dict[str, object] = {}
        changes = False
        if key == 0:
            given["acks"] = draw(st.sampled_from([1, -1]))
        if key == 8 and draw(st.booleans()):
            given.update(member_id="", generation_id_or_member_epoch=-1)
            changes = True
        if key == 22:
            given["transactional_id"] = draw(st.sampled_from([None, "tx"]))
            changes = given["transactional_id"] is not None
        if key in NOTED:  # a member no other request names: it may stay, not leave
            given["member_id"] = f"m-{correlation_id}"
        if key == 13:
            changes = True  # a member that was never this connection's leaves (see policy)
        if key in EPOCH_HEARTBEATS:
            epoch = draw(st.sampled_from([0, 3, -1, -2]))
            given["member_epoch"], changes = epoch, epoch < 0
        if key == 88:
            leaves, topology = changes, draw(st.booleans())
            given.update(topology=given_topology(version) if topology else None,
                         shutdown_application=draw(st.booleans()))  # fmt: skip
            changes = leaves or topology or bool(given["shutdown_application"])
        frames.append((request_frame(built(key, version, **given), correlation_id), key, changes))
    return frames


NAMES = sorted("".join(p.capitalize() for p in n.split("_")) for n in api_key_map.values())
DENIABLE = [n for n in NAMES if n not in ("ApiVersions", "SaslHandshake", "SaslAuthenticate")]
KEYS = {"".join(p.capitalize() for p in n.split("_")): k for k, n in api_key_map.items()}
# What read-only refuses outright: every API but what only reads and what is decided on
# the request (tests.protocol.test_policy lists both).
CHANGING = {k for n, k in KEYS.items() if n not in READS and n not in DECIDED}


@settings(max_examples=200, deadline=None)
@given(
    requests=_requests(),
    read_only=st.booleans(),
    deny=st.sets(st.sampled_from(DENIABLE), max_size=4),
    login=st.booleans(),
    cuts=st.lists(st.integers(1, 400), min_size=1, max_size=6),
)
def test_a_stream_of_every_api_and_version_passes_only_what_the_policy_allows(
    requests: list[tuple[bytes, int, bool]],
    read_only: bool,
    deny: set[str],
    login: bool,
    cuts: list[int],
) -> None:
    """The user's policy, and with a login of the tunnel's the client's own SASL login."""
    policy = Policy.guarding(Policy.of(read_only=read_only, deny=sorted(deny)),
                             "alice (PLAIN)" if login else None)  # fmt: skip
    denied = {KEYS[name] for name in deny} | (
        {SASL_HANDSHAKE, SASL_AUTHENTICATE} if login else set()
    )
    exchange = Exchange(tunnel_mapper, rewrite_caps(), policy=policy)

    upstream = drive(exchange.requests, b"".join(w for w, _, _ in requests), cuts, [False])

    went = FrameDecoder().feed(upstream)
    assert len(went) == len(requests)
    refusals = 0
    for (wire, key, changes), sent in zip(requests, went, strict=True):
        if key in denied or (read_only and (key in CHANGING or changes)):
            assert _stand_in(sent) == (API_VERSIONS, 0, _stand_in(wire)[2])
            refusals += 1
        else:
            assert sent == wire
    assert sum(exchange.stats.refused.values()) == refusals
