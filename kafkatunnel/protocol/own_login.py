"""A client's own SASL login through a tunnel that logs in for it: the tunnel answers it.

The tunnel's stream to the broker is logged in before the client's first byte passes (see
tunnel.login). A client's SaslHandshake must never reach the broker there: Kafka answers
it with ILLEGAL_SASL_STATE, which says nothing of why, and a broker that re-authenticates
(connections.max.reauth.ms, KIP-368) takes it for the start of a re-authentication of the
tunnel's own login. A SaslAuthenticate without a handshake (what a KIP-368
re-authentication may send) is no different. A Policy that knows the login refuses both
(Policy.login), and the client is answered here, in words its own error message shows:

- SaslHandshake: UNSUPPORTED_SASL_MECHANISM. Its answer has no message, only the
  mechanisms the listener enables, which clients print ("enabled mechanisms are [...]",
  Java's UnsupportedSaslMechanismException; "broker's supported mechanisms: ...",
  librdkafka's): the explanation stands there, as the mechanisms. librdkafka keeps 32
  bytes per mechanism listed (commas included) and joins them with ",", Java with ", ".
- SaslAuthenticate: SASL_AUTHENTICATION_FAILED with the explanation as its message.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import textwrap
from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from kafkatunnel.protocol.framing import frame
from kafkatunnel.protocol.headers import RequestHeader, response_head

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
LOGIN_APIS = frozenset({SASL_HANDSHAKE, SASL_AUTHENTICATE})
# librdkafka prints a handshake answer's mechanisms into 32 bytes per mechanism (511 at
# most), commas included: a mechanism of 31 characters or fewer never cuts the list short.
MECHANISM_WIDTH = 31
MECHANISMS_PRINTED = 510


def told(login: str) -> str:
    """Why the client's own login is refused, and its fix (`login`: who the tunnel logs in
    as, `alice (SCRAM-SHA-256)`)."""
    return (f"kafkatunnel logs in for its clients, as {login}: drop security.protocol and "
            "sasl.* from this client's settings")  # fmt: skip


def mechanisms_told(login: str) -> tuple[str, ...]:
    """The same, as a SaslHandshake answer's mechanisms: short phrases that read as one
    sentence joined by ", " (Java) or "," (librdkafka), each whole in librdkafka's print."""
    phrases = ("none: kafkatunnel logs in", f"as {login}", "for its clients",
               "drop security.protocol", "sasl.* from this client")  # fmt: skip
    if _printed(phrases):
        return phrases
    # a name too long for that: every phrase cut to MECHANISM_WIDTH
    cut = (textwrap.wrap(phrase, MECHANISM_WIDTH, break_on_hyphens=False) for phrase in phrases)
    return tuple(piece for pieces in cut for piece in pieces)


def _printed(mechanisms: tuple[str, ...]) -> bool:
    """Whether librdkafka prints all of these mechanisms."""
    printed = sum(map(len, mechanisms)) + len(mechanisms) - 1
    return printed <= min(MECHANISMS_PRINTED, (MECHANISM_WIDTH + 1) * len(mechanisms))


def own_login_answer(header: RequestHeader, login: str) -> bytes:
    """The whole answer frame to a client's SaslHandshake or SaslAuthenticate (the request
    itself is not read: nothing in it changes the answer). Raises (kio's errors) for a
    version kio has no schema of."""
    key, version = header.api_key, header.api_version
    if key not in LOGIN_APIS:
        raise ValueError(f"API {key} is no SASL login")
    response_type: Any = load_response_schema(key, version)
    if key == SASL_HANDSHAKE:
        body = response_type(error_code=ErrorCode.unsupported_sasl_mechanism,
                             mechanisms=mechanisms_told(login))  # fmt: skip
    else:
        fields = {field.name for field in dataclasses.fields(response_type)}
        lifetime = (
            {"session_lifetime": datetime.timedelta(0)} if "session_lifetime" in fields else {}
        )
        body = response_type(error_code=ErrorCode.sasl_authentication_failed,
                             error_message=told(login), auth_bytes=b"", **lifetime)  # fmt: skip
    out = io.BytesIO()
    out.write(response_head(header.correlation_id, key, version))
    entity_writer(response_type)(out, body)
    return frame(out.getvalue())
