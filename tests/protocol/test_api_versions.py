"""ApiVersions capping: a client never learns of a version the rewriter cannot parse."""

from __future__ import annotations

import dataclasses
import typing
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from kafkatunnel.protocol import cap_api_versions, rewrite_caps
from kafkatunnel.protocol.schema import known_versions
from tests.kio_messages import (
    api_versions_answer,
    api_versions_v5,
    decode,
    encode,
    response_body,
    response_frame,
    responses,
)

pytestmark = pytest.mark.quick

CAPS = rewrite_caps()
API_VERSIONS = 18


def versions_of(api_keys: st.SearchStrategy[int]) -> st.SearchStrategy[tuple[int, int, int]]:
    bounds = st.tuples(st.integers(0, 30), st.integers(0, 30)).map(sorted)
    return st.tuples(api_keys, bounds).map(lambda t: (t[0], t[1][0], t[1][1]))


@pytest.mark.parametrize("version", list(known_versions(API_VERSIONS)))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    entries=st.lists(
        versions_of(st.sampled_from(sorted(CAPS)) | st.integers(0, 90)),
        unique_by=lambda e: e[0],
        max_size=25,
    ),
)
def test_rewritten_apis_are_clamped_and_others_untouched(
    version: int, data: st.DataObject, entries: list[tuple[int, int, int]]
) -> None:
    response_type = load_response_schema(API_VERSIONS, version)
    entry_type: Any = response_type.__dataclass_fields__["api_keys"].type.__args__[0]  # type: ignore[union-attr]
    message = dataclasses.replace(
        data.draw(responses(API_VERSIONS, version)),
        error_code=ErrorCode.none,
        api_keys=tuple(
            entry_type(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in entries
        ),
    )
    wire = response_frame(API_VERSIONS, version, encode(message))

    capped = decode(
        response_type, response_body(API_VERSIONS, version, cap_api_versions(wire, version, CAPS))
    )

    expected = []
    for key, low, high in entries:
        allowed = CAPS.get(key)
        if allowed is None:
            expected.append((key, low, high))
        elif max(low, allowed.start) <= min(high, allowed.stop - 1):
            expected.append((key, max(low, allowed.start), min(high, allowed.stop - 1)))
    assert [
        (int(e.api_key), int(e.min_version), int(e.max_version)) for e in capped.api_keys
    ] == expected
    assert dataclasses.replace(capped, api_keys=()) == dataclasses.replace(message, api_keys=())


def test_nothing_to_clamp_passes_the_same_bytes() -> None:
    from kio.schema.api_versions.v0.response import ApiVersion as ApiKeys
    from kio.schema.api_versions.v0.response import ApiVersionsResponse

    message = ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=(ApiKeys(api_key=3, min_version=0, max_version=5),),  # type: ignore[arg-type]
    )
    wire = response_frame(API_VERSIONS, 0, encode(message))
    assert cap_api_versions(wire, 0, CAPS) is wire


def test_error_answers_pass_unchanged() -> None:
    """An UNSUPPORTED_VERSION answer only says which ApiVersions version to retry with; the
    librdkafka mock even writes it in a layout of its own (seen on the wire, kept here)."""
    mock_answer = bytes.fromhex("000000110000000100230100120000000200000000")
    assert cap_api_versions(mock_answer, 3, CAPS) is mock_answer


# tansu 0.6.0's answer to ApiVersions v3 (correlation id 7), as read from its socket: every
# tagged field written with its default value.
TANSU_ANSWER = bytes.fromhex(
    "0000011b00000007000025004b000000000000190000000400000d0000000500000e0000000500001200"
    "0000040000130000000700002a0000000200002c00000001000033000000000000150000000200001e00"
    "0000030000140000000600003200000000000047000000000000200000000400001d0000000300000f00"
    "000005000010000000050000080000000900001c000000040000240000000200000c0000000400004500"
    "00000000003c00000001000001000000110000000000000b00000a0000000600001a0000000400001600"
    "0000050000090000000900000b0000000900002e00000000000011000000010000030000000c00000200"
    "000009000018000000050000000000040001010108ffffffffffffffff020101030100"
)


def test_default_tagged_fields_are_dropped_and_nothing_else_changes() -> None:
    response_type = load_response_schema(API_VERSIONS, 3)
    before = decode(response_type, response_body(API_VERSIONS, 3, TANSU_ANSWER))
    capped = cap_api_versions(TANSU_ANSWER, 3, CAPS)
    assert capped.endswith(bytes(5))  # throttle_time_ms 0, then no tagged field at all
    after = decode(response_type, response_body(API_VERSIONS, 3, capped))
    assert dataclasses.replace(after, api_keys=()) == dataclasses.replace(before, api_keys=())


@pytest.mark.parametrize("version", [v for v in known_versions(API_VERSIONS) if v >= 3])
def test_tagged_fields_with_values_are_kept(version: int) -> None:
    response_type = load_response_schema(API_VERSIONS, version)
    features = typing.get_type_hints(response_type)["finalized_features"]
    feature_type: Any = typing.get_args(features)[0]
    feature = feature_type(name="metadata.version", max_version_level=20, min_version_level=20)
    message = dataclasses.replace(
        decode(response_type, response_body(API_VERSIONS, 3, TANSU_ANSWER)),
        api_keys=(),
        finalized_features_epoch=7,
        finalized_features=(feature,),
        zk_migration_ready=True,
    )
    wire = response_frame(API_VERSIONS, version, encode(message))
    capped = cap_api_versions(wire, version, CAPS)
    assert decode(response_type, response_body(API_VERSIONS, version, capped)) == message


def test_a_recording_tunnel_caps_every_api_to_what_it_can_read() -> None:
    """Kafka 4.4's brokers offer StreamsGroupHeartbeat and TxnOffsetCommit at versions newer
    than the schemas here: a recording tunnel advertises only the versions it can read (so
    every request is recorded), and keeps the rewriter's wider caps (old Produce versions)."""
    from kafkatunnel.protocol import readable_caps

    caps = {**readable_caps(), **CAPS}
    streams_heartbeat, txn_offset_commit, produce = 88, 28, 0
    newer = {key: known_versions(key).stop for key in (streams_heartbeat, txn_offset_commit)}
    version = max(known_versions(API_VERSIONS))
    response_type = load_response_schema(API_VERSIONS, version)
    entry_type: Any = response_type.__dataclass_fields__["api_keys"].type.__args__[0]  # type: ignore[union-attr]
    entries = [entry_type(api_key=k, min_version=0, max_version=v) for k, v in newer.items()]
    entries.append(entry_type(api_key=produce, min_version=0, max_version=20))
    message = response_type(error_code=ErrorCode.none, api_keys=tuple(entries),
                            throttle_time=timedelta(0))  # type: ignore[call-arg]  # fmt: skip
    wire = response_frame(API_VERSIONS, version, encode(message))
    capped = decode(
        response_type, response_body(API_VERSIONS, version, cap_api_versions(wire, version, caps))
    )
    ranges = {int(e.api_key): (int(e.min_version), int(e.max_version)) for e in capped.api_keys}
    for key, offered in newer.items():
        assert ranges[key] == (0, offered - 1), (key, ranges)
    assert ranges[produce] == (0, known_versions(produce).stop - 1)


@pytest.mark.parametrize("cluster_id", ["c1", None])
def test_rebootstrap_required_names_the_node_the_client_meant(cluster_id: str | None) -> None:
    from kafkatunnel.protocol import misdirected_to

    refused, fine = api_versions_answer(129), api_versions_answer(0)
    assert misdirected_to(api_versions_v5(2, cluster_id), refused) == 2
    assert misdirected_to(api_versions_v5(2, cluster_id), fine) is None
    assert misdirected_to(api_versions_v5(-1, cluster_id), refused) is None  # not said
    older = bytearray(api_versions_v5(2, cluster_id))
    older[7] = 4  # v4 names no node
    assert misdirected_to(bytes(older), refused) is None
    assert misdirected_to(api_versions_v5(2, cluster_id)[:-6], refused) is None  # cut short
