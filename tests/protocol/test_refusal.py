"""A refused request's answer: for every API and version read-only refuses, built from a
request kio encoded and read back by kio, it is the answer Kafka gives an unauthorized
client: the request's correlation id, the API's authorization error in every error code,
the reason in every error message, and one result for each thing the request named."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map

from kafkatunnel.protocol import (
    READ_ONLY,
    parse_request_header,
    refusal,
    response_body_offset,
    response_correlation_id,
)
from kafkatunnel.protocol.policy import SOME, UNREFUSABLE
from tests.kio_messages import decode, request_frame
from tests.protocol.requests_built import built, error_fields

pytestmark = pytest.mark.quick

TOPIC = ErrorCode.topic_authorization_failed
GROUP = ErrorCode.group_authorization_failed
CLUSTER = ErrorCode.cluster_authorization_failed
TRANSACTION = ErrorCode.transactional_id_authorization_failed
TOKEN = ErrorCode.delegation_token_authorization_failed
# What Kafka's broker answers a client without the right to each (KafkaApis).
EXPECTED = {
    "Produce": TOPIC, "DeleteRecords": TOPIC, "CreateTopics": TOPIC, "DeleteTopics": TOPIC,
    "CreatePartitions": TOPIC, "DeleteGroups": GROUP, "OffsetDelete": GROUP,
    "OffsetCommit": GROUP, "AlterShareGroupOffsets": GROUP, "DeleteShareGroupOffsets": GROUP,
    "LeaveGroup": GROUP, "ConsumerGroupHeartbeat": GROUP, "ShareGroupHeartbeat": GROUP,
    "StreamsGroupHeartbeat": GROUP,
    "InitProducerId": TRANSACTION, "AddPartitionsToTxn": TRANSACTION,
    "AddOffsetsToTxn": TRANSACTION, "EndTxn": TRANSACTION, "TxnOffsetCommit": TRANSACTION,
    "CreateDelegationToken": TOKEN, "RenewDelegationToken": TOKEN,
    "ExpireDelegationToken": TOKEN,
}  # fmt: skip
REASON = "the tunnel is read-only (kafkatunnel up --read-only)"
REFUSED = [
    (key, version)
    for key in sorted(READ_ONLY | SOME)
    for version in sorted(schema_name_map[api_key_map[key]])
]


def _title(key: int) -> str:
    return "".join(part.capitalize() for part in api_key_map[key].split("_"))


def _expected(key: int, item: Any) -> ErrorCode:
    if _title(key) in ("AlterConfigs", "IncrementalAlterConfigs") and item is not None:
        return TOPIC if int(item.resource_type) == 2 else CLUSTER
    return EXPECTED.get(_title(key), CLUSTER)


def _lists(value: Any) -> dict[str, int]:
    """How many items each top-level list of structs holds."""
    hints = typing.get_type_hints(type(value))
    return {
        field.name: len(getattr(value, field.name) or ())
        for field in dataclasses.fields(value)
        if "tag" not in field.metadata
        and typing.get_origin(hints[field.name]) is tuple
        and dataclasses.is_dataclass(typing.get_args(hints[field.name])[0])
    }


@pytest.mark.parametrize(("key", "version"), REFUSED, ids=[f"{_title(k)}-v{v}" for k, v in REFUSED])
def test_every_refused_api_and_version_is_answered_as_kafka_answers_an_unauthorized_client(
    key: int, version: int
) -> None:
    wire = request_frame(built(key, version), correlation_id=0x5EED)
    header = parse_request_header(wire)

    answer = refusal(wire, header, REASON)

    assert response_correlation_id(answer) == 0x5EED
    body_at = response_body_offset(answer, key, version)
    body = decode(load_response_schema(key, version), answer[body_at:])
    errors = error_fields(body)
    codes = [(value, owner) for name, value, owner in errors if not name.endswith("message")]
    assert codes, "the answer carries no error code at all"
    for value, owner in codes:
        assert value == _expected(key, owner if hasattr(owner, "resource_type") else None)
    for name, value, _ in errors:
        if name.endswith("message"):
            assert value == f"Authorization failed: {REASON}"
    # one result for each thing asked (two of each in every request built here; two lists
    # of two for users and log dirs), where the answer lists them at its top level
    asked = 4 if _title(key) in ("AlterReplicaLogDirs", "AlterUserScramCredentials") else 2
    for name, count in _lists(body).items():
        assert count == asked, f"{name}: {count} results for {asked} requested"


def test_a_refusal_names_what_the_request_named() -> None:
    """DeleteTopics v6: each topic by its name and id; Produce v9: each partition by index."""
    request = built(20, 6)
    wire = request_frame(request, correlation_id=3)
    answer = refusal(wire, parse_request_header(wire), REASON)
    body = decode(load_response_schema(20, 6), answer[response_body_offset(answer, 20, 6) :])
    assert [(r.name, r.topic_id) for r in body.responses] == [
        (t.name, t.topic_id) for t in request.topics
    ]

    produce = built(0, 9, acks=1)
    wire = request_frame(produce, correlation_id=4)
    answer = refusal(wire, parse_request_header(wire), REASON)
    body = decode(load_response_schema(0, 9), answer[response_body_offset(answer, 0, 9) :])
    assert [
        (t.name, [(p.index, p.error_code, p.base_offset) for p in t.partition_responses])
        for t in body.responses
    ] == [(t.name, [(p.index, TOPIC, -1) for p in t.partition_data]) for t in produce.topic_data]


DENIABLE = [
    (key, version)
    for key in sorted(set(api_key_map) - UNREFUSABLE)
    for version in sorted(schema_name_map[api_key_map[key]])
]


@pytest.mark.parametrize(("key", "version"), DENIABLE,
                         ids=[f"{_title(k)}-v{v}" for k, v in DENIABLE])  # fmt: skip
def test_every_api_a_user_may_deny_is_answered_with_kafkas_own_schema(
    key: int, version: int
) -> None:
    """`--deny-api` takes any API but the login's: each refusal is built, as Kafka's schema
    for its answer reads it (a records field, FetchSnapshot's, included)."""
    wire = request_frame(built(key, version), correlation_id=0x5EED)
    answer = refusal(wire, parse_request_header(wire), REASON)
    assert response_correlation_id(answer) == 0x5EED
    body_at = response_body_offset(answer, key, version)
    body = decode(load_response_schema(key, version), answer[body_at:])
    assert [v for n, v, _ in error_fields(body) if not n.endswith("message")], "no error code"
