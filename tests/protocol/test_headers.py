"""Request headers, acks=0 detection and correlation tracking, against kio-encoded requests."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.index import schema_name_map
from kio.static.primitive import i32Timedelta

from kafkatunnel.protocol import (
    CorrelationTracker,
    DuplicateCorrelationId,
    MalformedMessage,
    UnmatchedResponse,
    expects_response,
    frame,
    parse_request_header,
)
from kafkatunnel.protocol.schema import known_versions
from tests.kio_messages import request_frame, requests

pytestmark = pytest.mark.quick

PRODUCE_VERSIONS = list(known_versions(0))
SAMPLE_APIS = [(0, v) for v in PRODUCE_VERSIONS] + [
    (key, version) for key in (3, 8, 10, 11, 18, 22, 68) for version in known_versions(key)
]


@pytest.mark.parametrize(("api_key", "version"), SAMPLE_APIS, ids=str)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), correlation_id=st.integers(-(2**31), 2**31 - 1))
def test_header_fields_and_body_offset(
    api_key: int, version: int, data: st.DataObject, correlation_id: int
) -> None:
    client_id = data.draw(st.none() | st.text(max_size=20))
    payload = data.draw(requests(api_key, version))
    wire = request_frame(payload, correlation_id, client_id)
    header = parse_request_header(wire)
    assert (header.api_key, header.api_version) == (api_key, version)
    assert header.correlation_id == correlation_id
    assert header.client_id == client_id
    from tests.kio_messages import encode

    assert header.body_offset is not None
    assert wire[header.body_offset :] == encode(payload)


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_acks_zero_expects_no_response(version: int, data: st.DataObject) -> None:
    import dataclasses

    acks = data.draw(st.sampled_from([-1, 0, 1]))
    payload = dataclasses.replace(data.draw(requests(0, version)), acks=acks)
    wire = request_frame(payload)
    assert expects_response(wire, parse_request_header(wire)) == (acks != 0)


def test_tracker_leaves_nothing_waiting_for_acks_zero() -> None:
    import dataclasses

    from kio.schema.produce.v9.request import ProduceRequest

    tracker = CorrelationTracker()
    timeout = i32Timedelta.parse(datetime.timedelta(seconds=1))
    base = ProduceRequest(transactional_id=None, acks=0, timeout=timeout, topic_data=())  # type: ignore[arg-type]
    for correlation_id in range(5):
        wire = request_frame(base, correlation_id)
        header = parse_request_header(wire)
        tracker.request(header, expects_response(wire, header))
    assert len(tracker) == 0
    answered = request_frame(dataclasses.replace(base, acks=1), 9)  # type: ignore[arg-type]
    header = parse_request_header(answered)
    tracker.request(header, expects_response(answered, header))
    assert tracker.response(9).api_key == 0
    assert len(tracker) == 0


def test_unmatched_and_duplicate_correlation_ids() -> None:
    from kio.schema.metadata.v1.request import MetadataRequest

    tracker = CorrelationTracker()
    header = parse_request_header(request_frame(MetadataRequest(topics=None), 42))
    tracker.request(header)
    with pytest.raises(DuplicateCorrelationId, match="42"):
        tracker.request(header)
    with pytest.raises(UnmatchedResponse, match="correlation id 43 matches no request"):
        tracker.response(43)
    assert tracker.response(42).api_version == 1


def test_garbage_headers() -> None:
    with pytest.raises(MalformedMessage, match="too short"):
        parse_request_header(frame(b"\x00\x03"))
    with pytest.raises(MalformedMessage, match="not a Kafka request"):
        parse_request_header(frame(b"\xff\xff\x00\x01\x00\x00\x00\x01\x00\x00"))
    with pytest.raises(MalformedMessage, match="string"):
        parse_request_header(frame(b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x09ab"))


def test_unknown_api_key_still_parses_the_shared_prefix() -> None:
    assert "999" not in {str(k) for k in schema_name_map}
    header = parse_request_header(frame(b"\x03\xe7\x00\x00\x00\x00\x00\x05\x00\x01x"))
    assert (header.api_key, header.correlation_id, header.client_id) == (999, 5, "x")
    assert header.body_offset is None  # the header version of an unknown API is unknown
