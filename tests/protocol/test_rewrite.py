"""The rewriter against kio, an independent encoder generated from Kafka's JSON schemas:
for generated messages of every version of every rewritten API, decoding the rewritten
bytes gives the original message with only the broker addresses changed."""

from __future__ import annotations

import dataclasses
import datetime
import io
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.schema.metadata.v12.response import MetadataResponse, MetadataResponseBroker
from kio.schema.produce.v11.response import NodeEndpoint, ProduceResponse
from kio.serial import entity_writer
from kio.serial.writers import write_unsigned_varint
from kio.static.primitive import i32Timedelta

from kafkatunnel.protocol import (
    REWRITTEN_APIS,
    BrokerAddress,
    MalformedMessage,
    UnsupportedVersion,
    needs_rewrite,
    rewrite_response,
)
from kafkatunnel.protocol.rewrite import NOT_REWRITTEN_WITH_ENDPOINTS
from kafkatunnel.protocol.schema import known_versions, response_plan
from tests.kio_messages import (
    encode,
    map_addresses,
    response_body,
    response_frame,
    responses,
)

pytestmark = pytest.mark.quick

NO_THROTTLE = i32Timedelta.parse(datetime.timedelta(0))
ADDRESSED = [
    (key, version)
    for key in REWRITTEN_APIS
    for version in known_versions(key)
    if needs_rewrite(key, version)
]


def tunnel_mapper(address: BrokerAddress) -> tuple[str, int]:
    return (f"127.0.0.{1 + address.node_id % 250}", 20000 + address.node_id % 40000)


def test_the_rewritten_apis_are_exactly_those_whose_responses_carry_addresses() -> None:
    """Scan every response of every API in Kafka's definitions: none outside the list holds
    a host and port, except those left alone on purpose, so no broker address can leak
    through an API the rewriter skips."""
    carrying = set()
    for name, versions in schema_name_map.items():
        key = next((k for k, n in api_key_map.items() if n == name), None)
        if key is None:
            continue  # a data schema (records, headers), not an API
        for version in versions:
            if response_plan(key, version).has_addresses:
                carrying.add(key)
    assert carrying == set(REWRITTEN_APIS) | set(NOT_REWRITTEN_WITH_ENDPOINTS)


def test_every_addressed_version_is_covered() -> None:
    expected = {0: range(10, 14), 1: range(16, 19), 3: range(0, 14), 10: range(0, 7)}
    for key, versions in expected.items():
        assert [v for k, v in ADDRESSED if k == key] == list(versions)
    assert {k for k, _ in ADDRESSED} == set(REWRITTEN_APIS)


@pytest.mark.parametrize(("api_key", "version"), ADDRESSED, ids=lambda v: str(v))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_rewrite_changes_only_addresses(api_key: int, version: int, data: st.DataObject) -> None:
    original = data.draw(responses(api_key, version))
    wire = response_frame(api_key, version, encode(original))
    expected_seen: list[BrokerAddress] = []
    expected = map_addresses(original, tunnel_mapper, expected_seen)

    result = rewrite_response(wire, api_key, version, tunnel_mapper)

    # Compared as bytes: kio's encoding is canonical, and generated datetimes can fall in a
    # repeated hour (PEP 495), where they never equal the same instant read back in UTC.
    assert response_body(api_key, version, result.frame) == encode(expected)
    assert sorted(result.seen, key=repr) == sorted(expected_seen, key=repr)
    assert int.from_bytes(result.frame[:4], "big") == len(result.frame) - 4
    assert result.frame[4:8] == wire[4:8]  # the correlation id
    if expected == original:
        assert result.frame is wire


@pytest.mark.parametrize(("api_key", "version"), ADDRESSED, ids=lambda v: str(v))
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_identity_mapping_passes_the_same_bytes(
    api_key: int, version: int, data: st.DataObject
) -> None:
    original = data.draw(responses(api_key, version))
    wire = response_frame(api_key, version, encode(original))
    result = rewrite_response(wire, api_key, version, lambda a: (a.host, a.port))
    assert result.frame is wire
    assert not result.changed


def _with_unknown_top_level_tag(entity: Any, tag: int, payload: bytes) -> bytes:
    """Encode `entity` with an extra tagged field kio does not know about.

    The tagged section is last; it is found as the bytes beyond the encoding of the same
    message with every tagged field at its default (whose tagged section is one 0 byte).
    """
    defaults = {f.name: f.default for f in dataclasses.fields(entity) if "tag" in f.metadata}
    bare = dataclasses.replace(entity, **defaults)
    full, untagged = encode(entity), encode(bare)[:-1]
    assert full.startswith(untagged)
    section = full[len(untagged) :]
    count = section[0]
    assert count < 0x7F
    varint = io.BytesIO()
    write_unsigned_varint(varint, tag)  # type: ignore[arg-type]
    extra = varint.getvalue()
    return untagged + bytes([count + 1]) + section[1:] + extra + bytes([len(payload)]) + payload


def test_unknown_top_level_tagged_field_survives_a_rewrite() -> None:
    def produce_response(host: str, port: int) -> ProduceResponse:
        return ProduceResponse(
            responses=(),
            throttle_time=NO_THROTTLE,
            node_endpoints=(NodeEndpoint(node_id=2, host=host, port=port, rack=None),),  # type: ignore[arg-type]
        )

    unknown = b"\xde\xad\xbe\xef"
    wire = response_frame(
        0, 11, _with_unknown_top_level_tag(produce_response("k-2", 9092), 300, unknown)
    )

    result = rewrite_response(wire, 0, 11, tunnel_mapper)

    expected_body = _with_unknown_top_level_tag(produce_response("127.0.0.3", 20002), 300, unknown)
    assert result.frame == response_frame(0, 11, expected_body)


def test_unknown_tagged_field_inside_a_broker_survives_a_rewrite() -> None:
    broker = MetadataResponseBroker(node_id=1, host="kafka-1.kafka", port=9092, rack="r1")  # type: ignore[arg-type]
    encoded_broker = encode(broker)
    assert encoded_broker.endswith(b"\x00")
    unknown = b"\x01\x02\x03"
    patched_broker = encoded_broker[:-1] + b"\x01\x05\x03" + unknown
    message = MetadataResponse(
        throttle_time=NO_THROTTLE,
        brokers=(broker,),
        cluster_id="c",
        controller_id=1,  # type: ignore[arg-type]
        topics=(),
    )
    plain = encode(message)
    start = plain.index(encoded_broker)
    body = plain[:start] + patched_broker + plain[start + len(encoded_broker) :]
    wire = response_frame(3, 12, body)

    result = rewrite_response(wire, 3, 12, tunnel_mapper)

    assert b"\x01\x05\x03" + unknown in result.frame
    assert b"kafka-1.kafka" not in result.frame
    assert result.seen == (BrokerAddress(1, "kafka-1.kafka", 9092),)


def test_find_coordinator_without_a_coordinator_is_left_alone() -> None:
    from kio.schema.find_coordinator.v3.response import FindCoordinatorResponse

    message = FindCoordinatorResponse(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.coordinator_not_available,
        error_message="not available",
        node_id=-1,  # type: ignore[arg-type]
        host="",
        port=-1,  # type: ignore[arg-type]
    )
    wire = response_frame(10, 3, encode(message))
    result = rewrite_response(wire, 10, 3, tunnel_mapper)
    assert result.frame is wire
    assert result.seen == ()


def test_responses_without_addresses_pass_undecoded() -> None:
    garbage = b"\x00\x00\x00\x08" + b"\x00\x00\x00\x07" + b"\xff\xff\xff\xff"
    # Fetch v12 carries no address: its body is never parsed, even when it is garbage.
    assert rewrite_response(garbage, 1, 12, tunnel_mapper).frame is garbage
    assert rewrite_response(garbage, 2, 5, tunnel_mapper).frame is garbage  # ListOffsets


def test_a_version_newer_than_the_rewriter_knows_is_refused() -> None:
    newest = known_versions(3).stop
    with pytest.raises(UnsupportedVersion, match=r"metadata v14"):
        rewrite_response(b"\x00\x00\x00\x04\x00\x00\x00\x01", 3, newest, tunnel_mapper)


def test_an_old_share_fetch_version_is_refused_not_passed() -> None:
    with pytest.raises(UnsupportedVersion):
        needs_rewrite(78, 0)


def test_truncated_response_raises_malformed() -> None:
    message = MetadataResponse(
        throttle_time=NO_THROTTLE,
        brokers=(MetadataResponseBroker(node_id=1, host="h", port=1, rack=None),),  # type: ignore[arg-type]
        cluster_id=None,
        controller_id=1,  # type: ignore[arg-type]
        topics=(),
    )
    wire = response_frame(3, 12, encode(message))
    for cut in range(9, 9 + 12):
        short = (cut - 4).to_bytes(4, "big") + wire[4:cut]
        with pytest.raises(MalformedMessage):
            rewrite_response(short, 3, 12, tunnel_mapper)


def test_kio_writer_is_the_encoder_in_use() -> None:
    # Guard: these tests mean something only if kio really writes Kafka's layout; a Metadata
    # v0 response with one broker must start with throttle-less broker array of length 1.
    from kio.schema.metadata.v0.response import MetadataResponse as M0
    from kio.schema.metadata.v0.response import MetadataResponseBroker as B0

    buffer = io.BytesIO()
    entity_writer(M0)(buffer, M0(brokers=(B0(node_id=5, host="ab", port=7),), topics=()))  # type: ignore[arg-type]
    assert buffer.getvalue() == (
        b"\x00\x00\x00\x01"
        + b"\x00\x00\x00\x05"
        + b"\x00\x02ab"
        + b"\x00\x00\x00\x07"
        + b"\x00\x00\x00\x00"
    )


def test_a_metadata_answer_is_read_only_up_to_its_brokers() -> None:
    """The cost of a rewrite follows the brokers, not the partitions: an answer cut right
    after its broker list (its topics never sent) rewrites the same, so nothing after the
    brokers was read. A cluster cannot make the tunnel walk a million partitions."""
    brokers = tuple(
        MetadataResponseBroker(node_id=n, host=f"kafka-{n}.example", port=9092, rack=None)  # type: ignore[arg-type]
        for n in range(1, 4)
    )
    message = MetadataResponse(
        throttle_time=NO_THROTTLE, brokers=brokers, cluster_id="c", controller_id=1,  # type: ignore[arg-type]
        topics=(),
    )  # fmt: skip
    whole = encode(message)
    rest = encode(dataclasses.replace(message, brokers=()))[4 + 1 :]  # after brokers: same
    assert whole.endswith(rest)
    cut = response_frame(3, 12, whole[: len(whole) - len(rest)])
    result = rewrite_response(cut, 3, 12, tunnel_mapper)
    assert [a.node_id for a in result.seen] == [1, 2, 3] and result.changed
