"""A client's own SASL login through a tunnel that logs in for it: the tunnel answers its
SaslHandshake and SaslAuthenticate, at every version kio has, in words the client's own
error message shows, and neither ever reaches the broker (an ApiVersions v0 goes in its
place); with --read-only too, each refusal says its own reason. Without a login, the
client's SASL passes byte for byte, --read-only or not."""

from __future__ import annotations

import datetime

import pytest
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map

from kafkatunnel.protocol import (
    Exchange,
    FrameDecoder,
    Policy,
    mechanisms_told,
    parse_request_header,
    refusal,
    refused_answer,
    response_body_offset,
    response_correlation_id,
    rewrite_caps,
)
from tests.kio_messages import decode, fetch_request, request_frame, response_frame
from tests.protocol.requests_built import built
from tests.protocol.test_guarded_passage import _api_versions_answer, _stand_in
from tests.protocol.test_passage import drive, tunnel_mapper

pytestmark = pytest.mark.quick

SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS, PRODUCE = 17, 36, 18, 0
LOGIN = "alice (SCRAM-SHA-256)"
READ_ONLY = Policy.of(read_only=True)
assert READ_ONLY is not None
READ_ONLY_REASON = READ_ONLY.reason
# What the client reads: Java prints the mechanisms as a list ("[a, b]"), librdkafka joins
# them with ",".
MECHANISMS = ("none: kafkatunnel logs in", "as alice (SCRAM-SHA-256)", "for its clients",
              "drop security.protocol", "sasl.* from this client")  # fmt: skip
MESSAGE = ("kafkatunnel logs in for its clients, as alice (SCRAM-SHA-256): drop "
           "security.protocol and sasl.* from this client's settings")  # fmt: skip
LOGINS = [
    (key, version)
    for key in (SASL_HANDSHAKE, SASL_AUTHENTICATE)
    for version in sorted(schema_name_map[api_key_map[key]])
]


@pytest.mark.parametrize("composed", [False, True], ids=["login", "login-and-read-only"])
@pytest.mark.parametrize(("key", "version"), LOGINS, ids=[f"{k}-v{v}" for k, v in LOGINS])
def test_every_version_of_a_clients_own_login_is_told_the_tunnel_logs_in_and_as_whom(
    key: int, version: int, composed: bool
) -> None:
    policy = Policy.guarding(READ_ONLY if composed else None, LOGIN)
    assert policy is not None
    wire = request_frame(built(key, version), correlation_id=0x5EED)
    header = parse_request_header(wire)
    assert policy.held(key) and policy.refuses(header, wire)

    answer = refused_answer(policy, wire, header)

    assert response_correlation_id(answer) == 0x5EED
    body_at = response_body_offset(answer, key, version)
    body = decode(load_response_schema(key, version), answer[body_at:])
    if key == SASL_HANDSHAKE:
        assert (body.error_code, body.mechanisms) == (
            ErrorCode.unsupported_sasl_mechanism, MECHANISMS)  # fmt: skip
    else:
        assert (body.error_code, body.error_message) == (
            ErrorCode.sasl_authentication_failed, MESSAGE)  # fmt: skip
        assert body.auth_bytes == b""  # never the client's own bytes back
        if hasattr(body, "session_lifetime"):
            assert body.session_lifetime == datetime.timedelta(0)


def librdkafka_prints(mechanisms: tuple[str, ...]) -> str:
    """What librdkafka (rd_kafka_handle_SaslHandshake, 2.x) prints of a handshake answer's
    mechanisms: joined by "," into a buffer of min(511, 1 + 32 * count) bytes, cut there."""
    size = min(511, 1 + 32 * len(mechanisms))
    return ",".join(mechanisms)[: size - 1]


@pytest.mark.parametrize(
    "login",
    [LOGIN, "svc-payments-eu-west-1-production (SCRAM-SHA-512)",
     "a-service-account-of-the-payments-team-with-a-very-long-name-indeed (PLAIN)"],
)  # fmt: skip
def test_librdkafka_prints_the_whole_explanation_whatever_the_name(login: str) -> None:
    told = mechanisms_told(login)
    assert librdkafka_prints(told) == ",".join(told)
    assert login.replace(" ", "") in "".join(told).replace(" ", "")


def _conversation(policy: Policy | None) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """(the client's requests, the broker's answers to what went upstream, what the client
    must receive): a fetch, its own SaslHandshake, SaslAuthenticate, and a Produce."""
    requests = [
        fetch_request(12, 1, 40),
        request_frame(built(SASL_HANDSHAKE, 1, mechanism="SCRAM-SHA-256"), 2),
        request_frame(built(SASL_AUTHENTICATE, 2, auth_bytes=b"n,,n=alice,r=nonce"), 3),
        request_frame(built(PRODUCE, 9, acks=-1), 4),
    ]
    fetched = response_frame(1, 12, b"\x00" * 30, 1)
    produced = response_frame(PRODUCE, 9, b"\x00" * 12, 4)
    broker = [fetched, *(_api_versions_answer(c) for c in (2, 3)), produced]
    assert policy is not None
    received = [fetched]
    for wire in requests[1:3]:
        received.append(refused_answer(policy, wire, parse_request_header(wire)))
    if policy.read_only:
        broker[3] = _api_versions_answer(4)
        received.append(refusal(requests[3], parse_request_header(requests[3]), policy.reason))
    else:
        received.append(produced)
    return requests, broker, received


@pytest.mark.parametrize("cut", [1, 7, 4096])
@pytest.mark.parametrize("composed", [False, True], ids=["login", "login-and-read-only"])
def test_a_clients_own_login_never_reaches_the_broker_and_is_answered_in_order(
    cut: int, composed: bool
) -> None:
    """Its frames never go upstream (a broker that re-authenticates would begin a
    re-authentication of the tunnel's login): ApiVersions v0 stand-ins go in their place,
    and the tunnel's answers reach the client where the broker's would have."""
    policy = Policy.guarding(READ_ONLY if composed else None, LOGIN)
    requests, broker, received = _conversation(policy)
    exchange = Exchange(tunnel_mapper, rewrite_caps(), policy=policy)

    upstream = drive(exchange.requests, b"".join(requests), [cut], [False])
    client = drive(exchange.responses, b"".join(broker), [cut], [False])

    went = FrameDecoder().feed(upstream)
    assert went[0] == requests[0]
    assert [_stand_in(sent) for sent in went[1:3]] == [(API_VERSIONS, 0, 2), (API_VERSIONS, 0, 3)]
    assert (_stand_in(went[3]) == (API_VERSIONS, 0, 4)) == composed  # read-only's Produce
    assert b"SCRAM-SHA-256" not in upstream and b"alice" not in upstream
    assert client == b"".join(received)
    refused = {SASL_HANDSHAKE: 1, SASL_AUTHENTICATE: 1}
    assert exchange.stats.refused == (refused | {PRODUCE: 1} if composed else refused)
    if composed:  # each refusal in its own words
        assert policy is not None and policy.reason_for(PRODUCE) == READ_ONLY_REASON


@pytest.mark.parametrize("policy", [None, READ_ONLY], ids=["no-policy", "read-only"])
def test_without_a_login_the_clients_sasl_passes_byte_for_byte(policy: Policy | None) -> None:
    assert Policy.guarding(policy, None) is policy
    exchange = Exchange(tunnel_mapper, rewrite_caps(), policy=policy)
    handshake = request_frame(built(SASL_HANDSHAKE, 1, mechanism="SCRAM-SHA-256"), 2)
    authenticate = request_frame(built(SASL_AUTHENTICATE, 2, auth_bytes=b"n,,n=alice"), 3)
    answers = [response_frame(SASL_HANDSHAKE, 1, b"\x00" * 6, 2),
               response_frame(SASL_AUTHENTICATE, 2, b"\x00" * 16, 3)]  # fmt: skip

    upstream = drive(exchange.requests, handshake + authenticate, [5], [False])
    client = drive(exchange.responses, b"".join(answers), [5], [False])

    assert upstream == handshake + authenticate
    assert client == b"".join(answers)
    assert exchange.stats.refused == {}
