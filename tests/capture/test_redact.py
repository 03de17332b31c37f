"""Redaction, checked against kio's own decoding of every version of every redacted API:
the secret and payload fields come out empty, every other field is unchanged."""

from __future__ import annotations

import dataclasses
import datetime
import typing
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map
from kio.serial._introspect import get_schema_field_type

from kafkatunnel.capture.redact import (
    PAYLOAD_REQUESTS,
    PAYLOAD_RESPONSES,
    SECRET_REQUESTS,
    SECRET_RESPONSES,
    redact_request,
    redact_response,
)
from kafkatunnel.protocol import known_versions, parse_request_header
from tests.kio_messages import (
    DESCEND,
    encode,
    replace_fields,
    request_frame,
    requests,
    response_frame,
    responses,
)

pytestmark = pytest.mark.quick

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _emptied(value: Any, kinds: set[str]) -> Any:
    """`value` with each field of those Kafka types emptied (null where nullable), but record
    sets of payload APIs made empty, never null (Wireshark 4.0 cannot read null ones)."""

    def empty(field: dataclasses.Field[Any], inner: Any) -> Any:
        kind = _kafka_type(field)
        if kind == "records" and kinds == {"records"}:
            return inner and b""  # record data goes; a null set stays null
        if field.metadata.get("tag") is None and kind in kinds:
            return None if "None" in str(field.type) else type(inner)(b"")
        return DESCEND

    return replace_fields(value, empty)


def _kafka_type(field: dataclasses.Field[Any]) -> str | None:
    try:
        return get_schema_field_type(field)
    except Exception:
        return None


def _versions(keys: set[int]) -> list[tuple[int, int]]:
    return [(key, version) for key in sorted(keys) for version in known_versions(key)]


@pytest.mark.parametrize(("api_key", "version"), _versions(SECRET_REQUESTS | PAYLOAD_REQUESTS))
@FAST
@given(data=st.data())
def test_requests_lose_secrets_and_records(api_key: int, version: int, data: st.DataObject) -> None:
    message = data.draw(requests(api_key, version))
    frame = request_frame(message)
    header = parse_request_header(frame)
    kinds = {"bytes", "records"} if api_key in SECRET_REQUESTS else {"records"}
    kept = redact_request(frame, header)
    assert kept == request_frame(_emptied(message, kinds))  # kio's encoding of the same, emptied
    if api_key in PAYLOAD_REQUESTS:
        assert redact_request(frame, header, payloads=True) is frame


@pytest.mark.parametrize(("api_key", "version"), _versions(SECRET_RESPONSES | PAYLOAD_RESPONSES))
@FAST
@given(data=st.data())
def test_responses_lose_secrets_and_records(
    api_key: int, version: int, data: st.DataObject
) -> None:
    message = data.draw(responses(api_key, version))
    frame = response_frame(api_key, version, encode(message))
    kinds = {"bytes", "records"} if api_key in SECRET_RESPONSES else {"records"}
    kept = redact_response(frame, api_key, version)
    assert kept == response_frame(api_key, version, encode(_emptied(message, kinds)))


def test_a_password_never_survives_and_other_apis_pass_as_they_are() -> None:
    from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest

    frame = request_frame(SaslAuthenticateRequest(auth_bytes=b"\0alice\0s3cr3t-pw"))
    kept = redact_request(frame, parse_request_header(frame))
    assert b"s3cr3t" not in kept and b"alice" not in kept
    from kio.schema.heartbeat.v4.request import HeartbeatRequest

    beat = request_frame(
        HeartbeatRequest(group_id="g", generation_id=1, member_id="m", group_instance_id=None)  # type: ignore[arg-type]
    )
    assert redact_request(beat, parse_request_header(beat)) is beat


def test_what_cannot_be_walked_keeps_only_its_header() -> None:
    from kio.schema.sasl_authenticate.v1.request import SaslAuthenticateRequest

    frame = request_frame(SaslAuthenticateRequest(auth_bytes=b"\0alice\0s3cr3t-pw"))
    header = parse_request_header(frame)
    assert header.body_offset is not None
    truncated = (len(frame) - 6).to_bytes(4, "big") + frame[4:-2]  # the token ends early
    kept = redact_request(truncated, parse_request_header(truncated))
    assert kept == (header.body_offset - 4).to_bytes(4, "big") + frame[4 : header.body_offset]
    assert b"s3cr3t" not in kept
    garbled = response_frame(36, 2, b"\x00\x00\x07" + b"s3cr3t")  # lengths that do not fit
    assert b"s3cr3t" not in redact_response(garbled, 36, 2)


# Requests that set configs, which can be passwords (`sasl.jaas.config`,
# `ssl.keystore.password`), listed here from Kafka's API table, not from the code under test.
SETS_CONFIGS = {19: "CreateTopics", 33: "AlterConfigs", 44: "IncrementalAlterConfigs"}


@pytest.mark.parametrize(("api_key", "version"), _versions(set(SETS_CONFIGS)))
@FAST
@given(data=st.data())
def test_config_values_never_reach_a_recording(
    api_key: int, version: int, data: st.DataObject
) -> None:
    """Every config value is nulled, its name and everything else kept."""
    message = data.draw(requests(api_key, version))
    frame = request_frame(message)

    def nulled(field: dataclasses.Field[Any], inner: Any) -> Any:
        return None if field.name == "value" else DESCEND

    kept = redact_request(frame, parse_request_header(frame))
    assert kept == request_frame(replace_fields(message, nulled))


def test_a_jaas_password_in_create_topics_is_cut() -> None:
    from kio.schema.create_topics.v7.request import (
        CreatableTopic,
        CreatableTopicConfig,
        CreateTopicsRequest,
    )
    from kio.schema.types import TopicName
    from kio.static.primitive import i16, i32, i32Timedelta

    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule password="s3cr3t";'
    config = CreatableTopicConfig(name="sasl.jaas.config", value=jaas)
    topic = CreatableTopic(
        name=TopicName("t"), num_partitions=i32(1), replication_factor=i16(1),
        assignments=(), configs=(config,),
    )  # fmt: skip
    timeout = i32Timedelta.parse(datetime.timedelta(seconds=1))
    request = CreateTopicsRequest(topics=(topic,), timeout=timeout, validate_only=False)
    frame = request_frame(request)
    kept = redact_request(frame, parse_request_header(frame))
    assert b"s3cr3t" not in kept and b"sasl.jaas.config" in kept


# Fields of Kafka's messages that hold secrets, by name, found in kio's schemas (Kafka's
# own JSON definitions), not in the code under test: SASL tokens, delegation-token HMACs,
# SCRAM salts and salted passwords, and Envelope's wrapped request or answer (any of those).
SECRET_FIELDS = {"auth_bytes", "hmac", "salt", "salted_password", "request_data",
                 "response_data", "request_principal"}  # fmt: skip


def _has_secret(entity_type: Any) -> bool:
    if not dataclasses.is_dataclass(entity_type):
        return False
    hints = typing.get_type_hints(entity_type)
    for field in dataclasses.fields(entity_type):
        if field.name in SECRET_FIELDS:
            return True
        nested = typing.get_args(hints[field.name]) or (hints[field.name],)
        if any(_has_secret(inner) for inner in nested if inner is not entity_type):
            return True
    return False


def _secret_bearing() -> list[tuple[int, int, bool]]:
    found = []
    for key in sorted(api_key_map):
        for version in range(0, 32):
            for response, load in ((False, load_request_schema), (True, load_response_schema)):
                try:
                    schema = load(key, version)
                except Exception:
                    continue
                if _has_secret(schema):
                    found.append((key, version, response))
    return found


SECRET_BEARING = _secret_bearing()


def _holds_secret(message: Any) -> bool:
    """Whether a drawn message has a secret field at all (its arrays may be empty)."""
    held: list[bool] = []

    def note(field: dataclasses.Field[Any], inner: Any) -> Any:
        held.append(field.name in SECRET_FIELDS)
        return DESCEND

    replace_fields(message, note)
    return any(held)


def test_the_secret_bearing_messages_are_found() -> None:
    keys = {(key, response) for key, _, response in SECRET_BEARING}
    assert {(36, False), (36, True), (38, True), (51, False), (58, False)} <= keys


@pytest.mark.parametrize(("api_key", "version", "response"), SECRET_BEARING)
@FAST
@given(data=st.data())
def test_every_secret_field_in_kafkas_schemas_is_emptied(
    api_key: int, version: int, response: bool, data: st.DataObject
) -> None:
    draw = responses if response else requests
    message = data.draw(draw(api_key, version))

    mark = b"s3cr3t-" + uuid.uuid4().bytes  # in every secret field, found nowhere else

    def planted(field: dataclasses.Field[Any], inner: Any) -> Any:
        return type(inner or b"")(mark) if field.name in SECRET_FIELDS else DESCEND

    message = replace_fields(message, planted)
    if response:
        frame = response_frame(api_key, version, encode(message))
        kept = redact_response(frame, api_key, version)
    else:
        frame = request_frame(message)
        kept = redact_request(frame, parse_request_header(frame))
    assert mark in frame or not _holds_secret(message)
    assert mark not in kept
