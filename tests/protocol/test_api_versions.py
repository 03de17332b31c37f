"""ApiVersions capping: a client never learns of a version the rewriter cannot parse."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from kafkatunnel.protocol import cap_api_versions, rewrite_caps
from kafkatunnel.protocol.schema import known_versions
from tests.kio_messages import decode, encode, response_body, response_frame, responses

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
