"""An Exchange that isolates (`up --isolate`): however the bytes are cut and whatever of
them passes unread, the broker receives every group and transactional id isolated (a
transactional Produce's id among them, its records still passing unread), the client
receives its own names back in the answers that carry them (with the brokers' addresses
still rewritten), a recording sees the records where they lie in the frame as it went
on, and clients are offered no API or version whose ids the tunnel could not see."""

from __future__ import annotations

import datetime
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.describe_groups.v5.response import DescribedGroup, DescribeGroupsResponse
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.find_coordinator.v4.response import Coordinator, FindCoordinatorResponse
from kio.schema.join_group.v9.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.join_group.v9.response import JoinGroupResponse
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v9.response import ProduceResponse
from kio.schema.types import GroupId
from kio.static.primitive import i32Timedelta

from kafkatunnel.protocol import Isolation, isolating_caps, narrowest
from kafkatunnel.protocol.passage import Exchange, FramePassed
from kafkatunnel.protocol.rewrite import BrokerAddress, rewrite_caps
from tests.kio_messages import decode, encode, request_frame, response_body, response_frame
from tests.protocol.test_passage import CUTS, UNREAD, drive, fed_in_pieces

pytestmark = pytest.mark.quick

ISOLATION = Isolation("kt-alice")
NO_TIME = i32Timedelta.parse(datetime.timedelta(0))
SECONDS = i32Timedelta.parse(datetime.timedelta(seconds=30))


def mapper(address: BrokerAddress) -> tuple[str, int]:
    return ("127.0.0.1", 19093 + address.node_id)


def _join(group: str) -> JoinGroupRequest:
    protocol = JoinGroupRequestProtocol(name="range", metadata=b"\x00\x01")
    return JoinGroupRequest(
        group_id=GroupId(group),
        session_timeout=SECONDS,
        rebalance_timeout=SECONDS,
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(protocol,),
        reason=None,
    )


def _produce(transactional_id: str | None, records: bytes) -> ProduceRequest:
    data = PartitionProduceData(index=0, records=records)  # type: ignore[arg-type]
    return ProduceRequest(transactional_id=transactional_id, acks=-1, timeout=SECONDS,  # type: ignore[arg-type]
                          topic_data=(TopicProduceData(name="t", partition_data=(data,)),))  # type: ignore[arg-type]  # fmt: skip


def _describe(group: str) -> DescribeGroupsRequest:
    return DescribeGroupsRequest(groups=(GroupId(group),), include_authorized_operations=False)


def _described(group: str) -> DescribeGroupsResponse:
    described = DescribedGroup(
        error_code=ErrorCode.none,
        group_id=GroupId(group),
        group_state="Stable",
        protocol_type="consumer",
        protocol_data="range",
        members=(),
        authorized_operations=0,  # type: ignore[arg-type]
    )
    return DescribeGroupsResponse(throttle_time=NO_TIME, groups=(described,))


def conversation(
    records: bytes, named: bool, told: bool | None = None
) -> tuple[list[bytes], list[bytes]]:
    """The client's requests and the broker's answers with the ids as the client names
    them (named) or as the cluster has them (isolated); the brokers as the cluster
    advertises them, or (named, or told) as the client is told them."""
    name = (lambda n: n) if named else ISOLATION.isolated
    as_told = named if told is None else told
    host, port = ("127.0.0.1", 19095) if as_told else ("kafka-2.kafka", 9092)
    coordinator = FindCoordinatorResponse(throttle_time=NO_TIME, coordinators=(
        Coordinator(key=name("orders"), node_id=2, host=host, port=port,  # type: ignore[arg-type]
                    error_code=ErrorCode.none, error_message=None),))  # fmt: skip
    requests = [
        request_frame(FindCoordinatorRequest(key_type=0, coordinator_keys=(name("orders"),)), 1),  # type: ignore[arg-type]
        request_frame(_join(name("orders")), 2),
        request_frame(_produce(name("payments"), records), 3),
        request_frame(_produce(None, records[: len(records) // 2]), 4),
        request_frame(_describe(name("orders")), 5),
    ]
    joined = JoinGroupResponse(throttle_time=NO_TIME, error_code=ErrorCode.none, generation_id=1,  # type: ignore[arg-type]
                               protocol_type="consumer", protocol_name="range", leader="m-1",
                               skip_assignment=False, member_id="m-1", members=())  # fmt: skip
    answers = [
        response_frame(10, 4, encode(coordinator), 1),
        response_frame(11, 9, encode(joined), 2),  # no id in it
        response_frame(0, 9, encode(ProduceResponse(responses=(), throttle_time=NO_TIME)), 3),
        response_frame(0, 9, encode(ProduceResponse(responses=(), throttle_time=NO_TIME)), 4),
        response_frame(15, 5, encode(_described(name("orders"))), 5),
    ]
    return requests, answers


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(0, 200_000),
    cuts=CUTS,
    unread=UNREAD,
    records_only=st.booleans(),
)
def test_any_chunking_gives_the_broker_isolated_ids_and_the_client_its_own(
    size: int, cuts: list[int], unread: list[bool], records_only: bool
) -> None:
    [size] = fed_in_pieces([size], cuts)
    records = random.randbytes(size)
    sent, expected = conversation(records, named=True)
    received, told = conversation(records, named=False)
    exchange = Exchange(mapper, rewrite_caps(), isolation=ISOLATION, records_only=records_only)
    exchange.observe()
    passed: list[FramePassed] = []

    out = drive(exchange.requests, b"".join(sent), cuts, unread, passed)
    assert out == b"".join(received)
    assert exchange.groups == {"orders"}  # payments is a transactional id
    if records_only:  # the records found where they lie in the frame as it went on
        transactional = received[2]
        [spans] = [f.records for f in passed if f.request and f.request[0].correlation_id == 3]
        assert spans is not None
        assert [transactional[start:end] for start, end in spans[0]] == (
            [records] if records else []
        )

    answered: list[FramePassed] = []
    assert drive(exchange.responses, b"".join(told), cuts, unread, answered) == b"".join(expected)
    # A recording holds the ids as the cluster has them, both ways (the addresses as told)
    _, recorded = conversation(records, named=False, told=True)
    held = [answered[i] for i in (0, 4)]  # those naming ids: held whole, never unread
    assert [b"".join(p for p in f.parts if not isinstance(p, int)) for f in held] == [
        recorded[0], recorded[4]]  # fmt: skip


def test_a_produce_without_a_transactional_id_passes_as_it_came() -> None:
    frame = request_frame(_produce(None, random.randbytes(5000)), 9)
    exchange = Exchange(mapper, rewrite_caps(), isolation=ISOLATION)
    fed = exchange.requests.feed(frame[:2000])
    assert b"".join(fed.out) == frame[:2000]  # its head went on: nothing held
    assert exchange.requests.unread == len(frame) - 2000


def test_a_transactional_produce_whose_head_holds_its_id_leaves_its_records_unread() -> None:
    records = random.randbytes(50_000)
    frame = request_frame(_produce("payments", records), 9)
    isolated = request_frame(_produce("payments.kt-alice", records), 9)
    exchange = Exchange(mapper, rewrite_caps(), isolation=ISOLATION)
    fed = exchange.requests.feed(frame[:2000])
    head = b"".join(fed.out)
    assert isolated.startswith(head) and len(head) > 2000  # the id grew the head
    assert exchange.requests.unread == len(frame) - 2000  # the rest may be spliced


def test_a_client_id_too_long_for_the_head_holds_the_frame_whole_and_still_isolates() -> None:
    records = random.randbytes(3000)
    long = "c" * 2000  # the header alone is longer than a request's head
    frame = request_frame(_produce("payments", records), 9, client_id=long)
    exchange = Exchange(mapper, rewrite_caps(), isolation=ISOLATION)
    out = b"".join(exchange.requests.feed(frame).out)
    assert out == request_frame(_produce("payments.kt-alice", records), 9, client_id=long)


def test_an_answer_naming_another_applications_group_keeps_its_name() -> None:
    """A group the cluster has that this tunnel did not isolate (a deployed one, listed by
    DescribeGroups' answer, say) is named as the cluster names it."""
    exchange = Exchange(mapper, rewrite_caps(), isolation=ISOLATION)
    asked = request_frame(_describe("orders"), 7)
    exchange.requests.feed(asked)
    answer = response_frame(15, 5, encode(_described("orders.kt-bob")), 7)
    out = b"".join(exchange.responses.feed(answer).out)
    assert decode(DescribeGroupsResponse, response_body(15, 5, out)).groups[0].group_id == (
        "orders.kt-bob"
    )


def test_clients_are_offered_only_what_the_schemas_know() -> None:
    """An API kio does not know, and versions past those it knows, are left out of the
    ApiVersions answer: a newer client could carry ids there the tunnel cannot see."""
    caps = narrowest(rewrite_caps(), isolating_caps())
    exchange = Exchange(mapper, caps, isolation=ISOLATION)
    exchange.requests.feed(request_frame_api_versions())
    offered = ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=(ApiVersion(api_key=11, min_version=0, max_version=99),  # type: ignore[arg-type]
                  ApiVersion(api_key=999, min_version=0, max_version=0)),  # type: ignore[arg-type]
        throttle_time=NO_TIME, supported_features=(), finalized_features_epoch=-1,  # type: ignore[arg-type]
        finalized_features=(), zk_migration_ready=False,
    )  # fmt: skip
    out = b"".join(exchange.responses.feed(response_frame(18, 3, encode(offered), 1)).out)
    answer = decode(ApiVersionsResponse, response_body(18, 3, out))
    assert [(a.api_key, a.max_version) for a in answer.api_keys] == [(11, caps[11].stop - 1)]


def request_frame_api_versions() -> bytes:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    return request_frame(ApiVersionsRequest(client_software_name="t",
                                            client_software_version="1"), 1)  # fmt: skip
