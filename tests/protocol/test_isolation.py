"""Isolated ids against kio, an independent encoder generated from Kafka's JSON schemas:
for generated messages of every version of every API that carries a group or
transactional id, decoding the isolated request gives the original with only its ids
isolated, and an answer naming isolated ids decodes as the one naming the client's."""

from __future__ import annotations

import dataclasses
import types
import typing
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.schema.types import GroupId, TransactionalId

from kafkatunnel.protocol import parse_request_header
from kafkatunnel.protocol.isolation import (
    Isolation,
    check_suffix,
    isolate_request,
    request_ids,
    response_ids,
    restore_response,
)
from kafkatunnel.protocol.schema import known_versions
from tests.kio_messages import (
    decode,
    encode,
    replace_fields,
    request_frame,
    requests,
    response_body,
    response_frame,
    responses,
)

pytestmark = pytest.mark.quick

ISOLATION = Isolation("kt-alice")
# kio's messages of a streams group's topology are large, and slow to draw
SLOW_OR_LARGE = [HealthCheck.too_slow, HealthCheck.data_too_large]
KEY = {name: key for key, name in api_key_map.items()}

# Every API whose requests carry a group or transactional id, reviewed: a Kafka release
# (through kio) that adds one fails test_every_api_carrying_an_id_is_reviewed until it is
# placed here, and says where it carries them.
ISOLATED_REQUESTS = {
    "add_offsets_to_txn", "add_partitions_to_txn", "alter_share_group_offsets",
    "consumer_group_describe", "consumer_group_heartbeat", "delete_groups",
    "delete_share_group_offsets", "describe_groups", "describe_share_group_offsets",
    "describe_transactions", "end_txn", "find_coordinator", "heartbeat", "init_producer_id",
    "join_group", "leave_group", "offset_commit", "offset_delete", "offset_fetch", "produce",
    "share_acknowledge", "share_fetch", "share_group_describe", "share_group_heartbeat",
    "streams_group_describe", "streams_group_heartbeat", "sync_group", "txn_offset_commit",
}  # fmt: skip
RESTORED_ANSWERS = {
    "add_partitions_to_txn", "consumer_group_describe", "delete_groups",
    "describe_groups", "describe_share_group_offsets", "describe_transactions",
    "find_coordinator", "offset_fetch", "share_group_describe", "streams_group_describe",
}  # fmt: skip
LISTED_AS_THE_CLUSTER_HAS_THEM = {"list_groups", "list_transactions"}
SENT_ONLY_BY_BROKERS = {
    "initialize_share_group_state", "read_share_group_state", "write_share_group_state",
    "delete_share_group_state", "read_share_group_state_summary",
}  # fmt: skip


def _base(hint: Any) -> Any:
    for _ in range(3):
        if typing.get_origin(hint) in (types.UnionType, typing.Union):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        elif typing.get_origin(hint) is tuple:
            hint = typing.get_args(hint)[0]
    return hint


# Named as an id, whatever kio types them (the share-group state APIs' are plain strings)
ID_NAMES = {"group_id", "group_ids", "groups_names", "transactional_id", "transactional_ids"}


def _carries_ids(entity: type, api: str) -> bool:
    hints = typing.get_type_hints(entity)
    for field in dataclasses.fields(entity):
        base = _base(hints[field.name])
        if base in (GroupId, TransactionalId) or field.name in ID_NAMES:
            return True
        if api == "find_coordinator" and field.name in ("key", "coordinator_keys"):
            return True
        if isinstance(base, type) and dataclasses.is_dataclass(base) and _carries_ids(base, api):
            return True
    return False


def _scan(response: bool) -> set[str]:
    loader = load_response_schema if response else load_request_schema
    return {
        name
        for name, versions in schema_name_map.items()
        if name in KEY  # not the embedded schemas (consumer_protocol_assignment, ...)
        for version in versions
        if _carries_ids(loader(KEY[name], version), name)
    }


def test_every_api_carrying_an_id_is_reviewed() -> None:
    assert _scan(response=False) == ISOLATED_REQUESTS | SENT_ONLY_BY_BROKERS
    assert _scan(response=True) == RESTORED_ANSWERS | LISTED_AS_THE_CLUSTER_HAS_THEM


def _pairs(names: set[str], response: bool) -> list[tuple[int, int]]:
    loader = load_response_schema if response else load_request_schema
    return [
        (KEY[name], version)
        for name in sorted(names)
        for version in known_versions(KEY[name])
        if _carries_ids(loader(KEY[name], version), name)
    ]


REQUESTS = _pairs(ISOLATED_REQUESTS, response=False)
ANSWERS = _pairs(RESTORED_ANSWERS, response=True)


def test_each_version_that_carries_an_id_has_a_plan_and_no_other_does() -> None:
    for name in ISOLATED_REQUESTS | SENT_ONLY_BY_BROKERS:
        for version in known_versions(KEY[name]):
            planned = request_ids(KEY[name], version) is not None
            assert planned == ((KEY[name], version) in REQUESTS), (name, version)
    for name in RESTORED_ANSWERS | LISTED_AS_THE_CLUSTER_HAS_THEM:
        for version in known_versions(KEY[name]):
            planned = response_ids(KEY[name], version) is not None
            assert planned == ((KEY[name], version) in ANSWERS), (name, version)


def _ids_changed(value: Any, change: typing.Callable[[str], str], api: str) -> Any:
    """`value` with every id in it changed, found by kio's types (independently of the
    tunnel's plans)."""
    if isinstance(value, tuple):
        return tuple(_ids_changed(item, change, api) for item in value)
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return value
    hints = typing.get_type_hints(type(value))

    def change_field(field: dataclasses.Field[Any], inner: Any) -> Any:
        base = _base(hints[field.name])
        named = base in (GroupId, TransactionalId) or (
            api == "find_coordinator" and field.name in ("key", "coordinator_keys")
        )
        if not named:
            return _ids_changed(inner, change, api)
        if isinstance(inner, tuple):
            return tuple(None if item is None else change(item) for item in inner)
        return None if inner is None else change(inner)

    return replace_fields(value, change_field)


def _encoded(
    make: typing.Callable[[], bytes], kind: type, body: typing.Callable[[bytes], bytes]
) -> bytes:
    """The frame kio writes; a drawn message kio itself cannot write, or not read back (a
    retention time past timedelta's range, say), is not a message, and is drawn again."""
    try:
        wire = make()
        decode(kind, body(wire))
    except (ValueError, OverflowError):
        assume(False)
        raise
    return wire


def _request_body(frame: bytes) -> bytes:
    body = parse_request_header(frame).body_offset
    assert body is not None
    return frame[body:]


@pytest.mark.parametrize(("api_key", "version"), REQUESTS)
@settings(max_examples=12, deadline=None, suppress_health_check=SLOW_OR_LARGE)
@given(data=st.data())
def test_a_request_decodes_with_only_its_ids_isolated(
    api_key: int, version: int, data: st.DataObject
) -> None:
    original = data.draw(requests(api_key, version))
    wire = _encoded(lambda: request_frame(original), type(original), _request_body)
    header = parse_request_header(wire)
    assert header.body_offset is not None
    result = isolate_request(wire, api_key, version, header.body_offset, ISOLATION)
    expected = _ids_changed(original, ISOLATION.isolated, api_key_map[api_key])
    assert decode(type(original), result[header.body_offset :]) == expected
    assert result[: header.body_offset][4:] == wire[4 : header.body_offset]  # header untouched


@pytest.mark.parametrize(("api_key", "version"), ANSWERS)
@settings(max_examples=12, deadline=None, suppress_health_check=SLOW_OR_LARGE)
@given(data=st.data())
def test_an_answer_naming_isolated_ids_decodes_as_naming_the_clients(
    api_key: int, version: int, data: st.DataObject
) -> None:
    told = data.draw(responses(api_key, version))
    api = api_key_map[api_key]
    answered = _ids_changed(told, ISOLATION.isolated, api)
    wire = _encoded(lambda: response_frame(api_key, version, encode(answered)), type(told),
                    lambda frame: response_body(api_key, version, frame))  # fmt: skip
    result = restore_response(wire, api_key, version, ISOLATION)
    assert decode(type(told), response_body(api_key, version, result)) == told


@pytest.mark.parametrize(("api_key", "version"), ANSWERS)
@settings(max_examples=5, deadline=None, suppress_health_check=SLOW_OR_LARGE)
@given(data=st.data())
def test_an_answer_naming_only_others_ids_passes_the_same_bytes(
    api_key: int, version: int, data: st.DataObject
) -> None:
    told = data.draw(responses(api_key, version))
    api = api_key_map[api_key]
    others = _ids_changed(told, lambda name: f"{name}.kt-bob", api)  # another user's
    wire = _encoded(lambda: response_frame(api_key, version, encode(others)), type(told),
                    lambda frame: response_body(api_key, version, frame))  # fmt: skip
    assert restore_response(wire, api_key, version, ISOLATION) is wire


def test_listing_answers_are_left_as_the_cluster_has_them() -> None:
    for name in LISTED_AS_THE_CLUSTER_HAS_THEM:
        for version in known_versions(KEY[name]):
            assert response_ids(KEY[name], version) is None


def test_an_unknown_tagged_field_is_kept_byte_for_byte() -> None:
    from kio.schema.join_group.v9.request import JoinGroupRequest, JoinGroupRequestProtocol

    request: Any = JoinGroupRequest
    message = request(group_id="orders", session_timeout=timedelta(seconds=10),
                      rebalance_timeout=timedelta(seconds=30),
                      member_id="", group_instance_id=None, protocol_type="consumer",
                      protocols=(JoinGroupRequestProtocol(name="range", metadata=b"m"),),
                      reason=None)  # fmt: skip
    wire = request_frame(message)
    assert wire.endswith(b"\x00")
    unknown = b"\x01\x63\x03abc"  # one tagged field, tag 99, 3 bytes
    patched = wire[:-1] + unknown
    patched = (len(patched) - 4).to_bytes(4, "big") + patched[4:]
    body = parse_request_header(patched).body_offset
    assert body is not None
    result = isolate_request(patched, 11, 9, body, ISOLATION)
    assert result.endswith(unknown)
    assert b"orders.kt-alice" in result and len(result) == len(patched) + len(".kt-alice")


def test_find_coordinator_asks_for_the_isolated_keys_and_answers_with_the_clients() -> None:
    from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest
    from kio.schema.find_coordinator.v6.response import Coordinator, FindCoordinatorResponse

    request: Any = FindCoordinatorRequest
    wire = request_frame(request(key_type=0, coordinator_keys=("orders", "billing")))
    body = parse_request_header(wire).body_offset
    assert body is not None
    asked = decode(FindCoordinatorRequest, isolate_request(wire, 10, 6, body, ISOLATION)[body:])
    assert asked.coordinator_keys == ("orders.kt-alice", "billing.kt-alice")
    coordinator: Any = Coordinator
    answer: Any = FindCoordinatorResponse
    told = answer(throttle_time=timedelta(0), coordinators=(coordinator(
        key="orders.kt-alice", node_id=2, host="h", port=9092, error_code=ErrorCode.none,
        error_message=None),))  # fmt: skip
    wire = response_frame(10, 6, encode(told))
    restored = decode(FindCoordinatorResponse,
                      response_body(10, 6, restore_response(wire, 10, 6, ISOLATION)))  # fmt: skip
    assert restored.coordinators[0].key == "orders"


def test_the_mapping_is_one_to_one() -> None:
    for name in ("orders", "orders.kt-alice", "a.b", "x" * 200, "grüße", ""):
        assert ISOLATION.original(ISOLATION.isolated(name)) == name
    assert ISOLATION.original("orders") is None
    assert ISOLATION.original("orders.kt-bob") is None


@pytest.mark.parametrize("suffix", ["", ".x", "a b", "a/b", "ä", "x" * 65, "a\n"])
def test_a_suffix_outside_kafkas_name_characters_is_refused(suffix: str) -> None:
    with pytest.raises(ValueError, match="--isolate-suffix"):
        check_suffix(suffix)
    with pytest.raises(ValueError, match="--isolate-suffix"):
        Isolation(suffix)


def test_a_suffix_of_kafkas_name_characters_is_taken() -> None:
    for suffix in ("kt-alice", "A_b.c-1", "x" * 64):
        assert check_suffix(suffix) == suffix
