"""--isolate-from-deployed, sans-I/O: the deployed groups asked what the client asks, as an
admin asks, and the isolated group's answer told their offsets where it has none of its
own, at every OffsetFetch version kio knows; and an Exchange that holds the client's
request until the deployed answers are handed over, then goes on."""

from __future__ import annotations

import dataclasses
import datetime
import typing
import uuid
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.static.primitive import i32Timedelta

from kafkatunnel.protocol import Exchange, Isolation, parse_request_header
from kafkatunnel.protocol.deployed_offsets import (
    OFFSET_FETCH,
    Committed,
    deployed_offsets,
    deployed_requests,
    seeded_answer,
)
from kafkatunnel.protocol.rewrite import rewrite_caps
from tests.kio_messages import decode, encode, request_frame, response_body, response_frame
from tests.protocol.test_passage import tunnel_mapper

pytestmark = pytest.mark.quick

VERSIONS = sorted(schema_name_map[api_key_map[OFFSET_FETCH]])
ISOLATION = Isolation("kt-anna", from_deployed=True)
TOPIC_ID = uuid.UUID(int=7)


def _make(entity: Any, **given: Any) -> Any:
    """An entity of this kio type: `given` fields, defaults, and the usual empty values."""
    hints = typing.get_type_hints(entity)
    values = dict(given)
    for field in dataclasses.fields(entity):
        if field.name in values or field.default is not dataclasses.MISSING:
            continue
        if field.name == "throttle_time":
            values[field.name] = i32Timedelta.parse(datetime.timedelta(0))
        elif field.name == "error_code":
            values[field.name] = ErrorCode.none
        elif field.name in ("metadata", "member_id"):
            values[field.name] = None
        elif field.name == "require_stable":
            values[field.name] = False
        else:
            raise AssertionError(f"{entity.__name__}.{field.name} ({hints[field.name]}) not given")
    return entity(**{k: v for k, v in values.items() if k in hints})


def _types(version: int, response: bool) -> dict[str, Any]:
    """The message's own type and its nested types, by their short names."""
    schema = (load_response_schema if response else load_request_schema)(OFFSET_FETCH, version)
    module = __import__(schema.__module__, fromlist=["_"])
    return {name: getattr(module, name) for name in dir(module) if name.startswith("OffsetFetch")}


def _topic(version: int, cls: Any, **fields: Any) -> Any:
    key = {"topic_id": TOPIC_ID} if version >= 10 else {"name": "orders"}
    return _make(cls, **key, **fields)


def _request(version: int, groups: list[str], member: str | None = "m-1") -> bytes:
    t = _types(version, response=False)
    topic_type = next(v for k, v in t.items() if k.startswith("OffsetFetchRequestTopic"))
    topics = (_topic(version, topic_type, partition_indexes=(0, 1)),)
    if version < 8:
        return request_frame(_make(t["OffsetFetchRequest"], group_id=groups[0], topics=topics), 5)
    group_type = t["OffsetFetchRequestGroup"]
    made = tuple(_make(group_type, group_id=g, topics=topics, member_id=member,
                       member_epoch=4) for g in groups)  # fmt: skip
    return request_frame(_make(t["OffsetFetchRequest"], groups=made), 5)


def _answer(version: int, offsets: dict[str, dict[int, int]], correlation_id: int = 5) -> bytes:
    """An answer naming, per group, each partition's committed offset (-1: none)."""
    t = _types(version, response=True)
    partition_type = next(v for k, v in t.items() if k.startswith("OffsetFetchResponsePartition"))
    topic_type = next(v for k, v in t.items() if k.startswith("OffsetFetchResponseTopic"))

    def topics(partitions: dict[int, int]) -> tuple[Any, ...]:
        made = tuple(_make(partition_type, partition_index=p, committed_offset=o,
                           committed_leader_epoch=3, metadata="m" if o >= 0 else None)
                     for p, o in partitions.items())  # fmt: skip
        return (_topic(version, topic_type, partitions=made),)

    if version < 8:
        [partitions] = offsets.values()
        body = _make(t["OffsetFetchResponse"], topics=topics(partitions))
    else:
        groups = tuple(_make(t["OffsetFetchResponseGroup"], group_id=g, topics=topics(p))
                       for g, p in offsets.items())  # fmt: skip
        body = _make(t["OffsetFetchResponse"], groups=groups)
    return response_frame(OFFSET_FETCH, version, encode(body), correlation_id)


def _told(version: int, answer: bytes) -> dict[str, dict[int, int]]:
    body = decode(load_response_schema(OFFSET_FETCH, version),
                  response_body(OFFSET_FETCH, version, answer))  # fmt: skip
    groups = [("?", body.topics)] if version < 8 else [(g.group_id, g.topics) for g in body.groups]
    return {
        str(group): {
            int(p.partition_index): int(p.committed_offset) for t in topics for p in t.partitions
        }
        for group, topics in groups
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_each_group_is_asked_alone_as_an_admin_at_the_clients_version(version: int) -> None:
    groups = ["orders", "payments"] if version >= 8 else ["orders"]
    whole = _request(version, groups)
    asks = deployed_requests(whole, parse_request_header(whole))
    assert list(asks) == groups
    for group, frame in asks.items():
        header = parse_request_header(frame)
        assert (header.api_version, header.correlation_id) == (version, 5)
        request = decode(load_request_schema(OFFSET_FETCH, version), frame[header.body_offset :])
        if version < 8:
            assert frame == whole  # one group, no member: the client's own request
            continue
        [asked] = request.groups
        assert asked.group_id == group and len(asked.topics) == 1
        if version >= 9:
            assert (asked.member_id, asked.member_epoch) == (None, -1)


@pytest.mark.parametrize("version", VERSIONS)
def test_an_isolated_partition_without_an_offset_is_told_the_deployed_one(version: int) -> None:
    """Partition 0 has no offset of its own: the deployed group's; partition 1 has the
    isolated group's own commit: kept. What the deployed group lacks stays -1."""
    deployed = deployed_offsets(_answer(version, {"orders": {0: 40, 1: 41, 2: -1}}), version)
    key = TOPIC_ID if version >= 10 else "orders"
    assert deployed == {(key, 0): Committed(40, 3 if version >= 5 else -1, "m"),
                        (key, 1): Committed(41, 3 if version >= 5 else -1, "m")}  # fmt: skip
    isolated = _answer(version, {"orders": {0: -1, 1: 7, 2: -1}})
    seeded = seeded_answer(isolated, version, "orders", {"orders": deployed})
    told = _told(version, seeded)
    assert list(told.values()) == [{0: 40, 1: 7, 2: -1}]
    assert seeded_answer(isolated, version, "orders", {}) is isolated


def _drive(exchange: Exchange, data: bytes) -> list[bytes]:
    fed = exchange.requests.feed(data)
    assert fed.unknown_brokers == ()
    return [bytes(c) for c in fed.out]


def test_the_exchange_holds_the_request_until_the_deployed_answers_then_seeds_its_answer() -> None:
    """The client's OffsetFetch stops its direction (what it sends after waits too); once
    the deployed answers are handed over it goes on isolated, and its answer tells the
    client the deployed offsets under its own group name."""
    version = VERSIONS[-1]
    exchange = Exchange(tunnel_mapper, rewrite_caps(), isolation=ISOLATION)
    asked = _request(version, ["orders"])
    later = request_frame(_make(load_request_schema(18, 3), client_software_name="t",
                                client_software_version="1"), 6)  # fmt: skip
    fed = exchange.requests.feed(asked + later)
    assert fed.out == [] and fed.deployed_wanted is not None
    ask = fed.deployed_wanted
    assert list(ask.requests) == ["orders"]
    assert exchange.requests.feed(b"").out == []
    unread = exchange.deployed_answered(ask, {"orders": _answer(version, {"orders": {0: 40}})})
    assert unread == {}
    sent = b"".join(bytes(c) for c in exchange.requests.resume().out)
    isolated = _request(version, ["orders.kt-anna"])
    assert sent == isolated + later
    answer = _answer(version, {"orders.kt-anna": {0: -1, 1: -1}})
    told = b"".join(bytes(c) for c in exchange.responses.feed(answer).out)
    assert _told(version, told) == {"orders": {0: 40, 1: -1}}


def test_a_deployed_answer_that_cannot_be_read_is_said_and_the_request_goes_on_unseeded() -> None:
    version = VERSIONS[-1]
    exchange = Exchange(tunnel_mapper, rewrite_caps(), isolation=ISOLATION)
    fed = exchange.requests.feed(_request(version, ["orders"]))
    assert fed.deployed_wanted is not None
    unread = exchange.deployed_answered(fed.deployed_wanted, {"orders": b"\x00\x00\x00\x02xx"})
    assert list(unread) == ["orders"]
    assert exchange.requests.resume().out  # it goes on
    answer = _answer(version, {"orders.kt-anna": {0: -1}})
    told = b"".join(bytes(c) for c in exchange.responses.feed(answer).out)
    assert _told(version, told) == {"orders": {0: -1}}


def test_without_from_deployed_an_offset_fetch_never_waits() -> None:
    exchange = Exchange(tunnel_mapper, rewrite_caps(), isolation=Isolation("kt-anna"))
    fed = exchange.requests.feed(_request(VERSIONS[-1], ["orders"]))
    assert fed.deployed_wanted is None and fed.out
