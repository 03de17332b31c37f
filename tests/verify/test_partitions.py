"""Reading which partitions an answer speaks for, by walking its bytes, checked against kio's
own decoding of random messages of every version verify reads."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafkatunnel.protocol import known_versions, parse_request_header
from kafkatunnel.verify.partitions import (
    FETCH,
    LEADER_APIS,
    METADATA,
    PartitionAnswer,
    fetch_rack,
    partition_answers,
)
from tests.kio_messages import encode, request_frame, requests, response_frame, responses

pytestmark = pytest.mark.quick

PARTITION_FIELDS = ("partition_index", "index", "partition")
ZERO = uuid.UUID(int=0)


def _expected(value: Any, topic: str | None = None, topic_id: str | None = None) -> list[Any]:
    """The partitions of a decoded answer, found by kio's field names (an oracle apart from
    the byte walk)."""
    out: list[Any] = []
    if isinstance(value, tuple):
        for item in value:
            out += _expected(item, topic, topic_id)
        return out
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return out
    names = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
             if not f.metadata.get("tag")}  # fmt: skip
    nested = any(dataclasses.is_dataclass(v) or isinstance(v, tuple) for v in names.values())
    if nested:
        for name in ("name", "topic"):
            if isinstance(names.get(name), str) or (name in names and names[name] is None):
                topic = names[name]
        if isinstance(names.get("topic_id"), uuid.UUID):
            topic_id = None if names["topic_id"] == ZERO else str(names["topic_id"])
    partition = next((names[f] for f in PARTITION_FIELDS if isinstance(names.get(f), int)), None)
    if partition is not None and "error_code" in names:
        leader = names.get("leader_id")
        out.append(PartitionAnswer(topic, topic_id, int(partition), int(names["error_code"]),
                                   None if leader is None else int(leader)))  # fmt: skip
    for field in names.values():
        if dataclasses.is_dataclass(field) or isinstance(field, tuple):
            out += _expected(field, topic, topic_id)
    return out


CASES = [(api, v) for api in (*LEADER_APIS, METADATA) for v in known_versions(api)]


@pytest.mark.parametrize(("api_key", "version"), CASES, ids=[f"{a}v{v}" for a, v in CASES])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_walk_finds_what_kio_decodes(api_key: int, version: int, data: st.DataObject) -> None:
    value = data.draw(responses(api_key, version))
    frame = response_frame(api_key, version, encode(value))
    body = len(frame) - len(encode(value))
    assert partition_answers(frame, api_key, version, body) == _expected(value)


@pytest.mark.parametrize("version", [v for v in known_versions(FETCH) if v >= 4])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_fetch_requests_rack_is_read(version: int, data: st.DataObject) -> None:
    value = data.draw(requests(FETCH, version))
    frame = request_frame(value)
    header = parse_request_header(frame)
    assert header.body_offset is not None
    rack = fetch_rack(frame, version, header.body_offset)
    assert rack == (value.rack_id if version >= 11 else None)
