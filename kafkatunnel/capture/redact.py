"""What a recording must not keep: credentials always, record data unless asked.

SaslAuthenticate carries passwords (PLAIN) and proofs (SCRAM); the delegation-token and
SCRAM-credential APIs carry secrets too: every bytes field of those messages is emptied.
Produce requests and Fetch/ShareFetch responses carry the application's records: their
record sets become null unless payloads are wanted. Everything else is kept byte for byte.
When a message cannot be walked (a version this tunnel does not know, or malformed bytes)
only its header is kept: a recording fails closed.
"""

from __future__ import annotations

from kafkatunnel.protocol import wire
from kafkatunnel.protocol.errors import ProtocolError
from kafkatunnel.protocol.framing import SIZE_PREFIX
from kafkatunnel.protocol.headers import RequestHeader, response_body_offset
from kafkatunnel.protocol.rewrite import ByteWalk, splice
from kafkatunnel.protocol.schema import FieldPlan, StructPlan, request_plan, response_plan

SASL_AUTHENTICATE = 36
# + RenewDelegationToken, ExpireDelegationToken, AlterUserScramCredentials requests
SECRET_REQUESTS = {SASL_AUTHENTICATE, 39, 40, 51}
# + CreateDelegationToken, DescribeDelegationToken responses
SECRET_RESPONSES = {SASL_AUTHENTICATE, 38, 41}
PAYLOAD_REQUESTS = {0}  # Produce
PAYLOAD_RESPONSES = {1, 78}  # Fetch, ShareFetch


class _Cut(ByteWalk):
    """Walks a whole message, replacing the chosen variable-length fields."""

    __slots__ = ("kinds",)

    def __init__(self, buf: bytes, kinds: frozenset[str]) -> None:
        super().__init__(buf, _keep)
        self.kinds = kinds

    def variable(self, field: FieldPlan, pos: int) -> int:
        end = super().variable(field, pos)
        if field.kafka_type in self.kinds:
            self.edits.append((pos, end, _empty(field)))
        return end


def _keep(_address: object) -> None:
    return None


def _empty(field: FieldPlan) -> bytes:
    if field.nullable:
        return wire.write_uvarint(0) if field.compact else (-1).to_bytes(4, "big", signed=True)
    return wire.write_uvarint(1) if field.compact else (0).to_bytes(4, "big")


def _cut(frame: bytes, plan: StructPlan, body: int, kinds: frozenset[str]) -> bytes:
    walk = _Cut(frame, kinds)
    walk.struct(plan, body, None)
    return splice(frame, walk.edits) if walk.edits else frame


def _head_only(frame: bytes, body: int) -> bytes:
    head = frame[SIZE_PREFIX:body]
    return len(head).to_bytes(SIZE_PREFIX, "big") + head


def _kinds(api_key: int, secret: set[int], payload: set[int], payloads: bool) -> frozenset[str]:
    if api_key in secret:
        return frozenset({"bytes", "records"})
    if api_key in payload and not payloads:
        return frozenset({"records"})
    return frozenset()


def redact_request(frame: bytes, header: RequestHeader, payloads: bool = False) -> bytes:
    """The request frame as a recording may keep it."""
    kinds = _kinds(header.api_key, SECRET_REQUESTS, PAYLOAD_REQUESTS, payloads)
    if not kinds:
        return frame
    body = header.body_offset
    if body is None:
        return _head_only(frame, min(len(frame), SIZE_PREFIX + 8))
    try:
        return _cut(frame, request_plan(header.api_key, header.api_version), body, kinds)
    except ProtocolError:
        return _head_only(frame, body)


def redact_response(frame: bytes, api_key: int, api_version: int, payloads: bool = False) -> bytes:
    """The response frame as a recording may keep it."""
    kinds = _kinds(api_key, SECRET_RESPONSES, PAYLOAD_RESPONSES, payloads)
    if not kinds:
        return frame
    try:
        body = response_body_offset(frame, api_key, api_version)
    except ProtocolError:
        return _head_only(frame, SIZE_PREFIX + 4)
    try:
        return _cut(frame, response_plan(api_key, api_version), body, kinds)
    except ProtocolError:
        return _head_only(frame, body)
