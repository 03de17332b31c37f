"""What a recording must not keep: credentials always, record data unless asked.

SaslAuthenticate carries passwords (PLAIN) and proofs (SCRAM); the delegation-token and
SCRAM-credential APIs carry secrets too: every bytes field of those messages is emptied.
Produce requests and Fetch/ShareFetch responses carry the application's records: their
record sets become empty unless payloads are wanted (empty rather than null: Wireshark 4.0
cannot dissect a Fetch answer with a null record set). Everything else is kept byte for
byte. When a message cannot be walked (a version this tunnel does not know, or malformed bytes)
only its header is kept: a recording fails closed.

Records are cut by the same schema walk that lets the relay splice them, so a recording
need never have read them: a frame may come as parts, bytes and counts of record bytes that
passed unread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kafkatunnel.protocol import wire
from kafkatunnel.protocol.errors import MalformedMessage, ProtocolError
from kafkatunnel.protocol.framing import SIZE_PREFIX
from kafkatunnel.protocol.headers import (
    RequestHeader,
    request_header_version,
    response_body_offset,
    response_header_version,
)
from kafkatunnel.protocol.rewrite import ByteWalk, splice
from kafkatunnel.protocol.schema import FieldPlan, StructPlan, request_plan, response_plan
from kafkatunnel.protocol.streaming import (
    REQUEST_WALK_START,
    RESPONSE_WALK_START,
    TAIL,
    Walk,
    carrying_records,
    request_walk,
    walk,
)

# A frame as a recording saw it: bytes, and (ints) runs of record data that passed unread.
Part = bytes | memoryview | int
# Where the relay's walk found a frame's record data (offsets in it), and whether the
# message's encodings are compact (a flexible version).
Records = tuple[tuple[tuple[int, int], ...], bool]

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


SECRETS = frozenset({"bytes", "records"})


def redact_request(
    frame: bytes | list[Part],
    header: RequestHeader,
    payloads: bool = False,
    records: Records | None = None,
) -> bytes:
    """The request frame as a recording may keep it. A frame given as parts (some of its
    record data passed unread) must be one whose records are cut; `records`, where the
    relay's walk found them, spares walking it again."""
    key, version = header.api_key, header.api_version
    whole = frame if isinstance(frame, bytes) else None
    secret = key in SECRET_REQUESTS
    if whole is not None and not secret and (payloads or key not in PAYLOAD_REQUESTS):
        return whole
    head = _first_bytes(frame)
    body = header.body_offset
    if body is None:
        return _head_only(head, min(len(head), SIZE_PREFIX + 8))
    return _redacted(
        frame,
        body,
        records,
        secret=lambda: request_plan(key, version) if secret else None,
        records_walk=lambda: _request_walk(key, version),
    )


def redact_response(
    frame: bytes | list[Part],
    api_key: int,
    api_version: int,
    payloads: bool = False,
    records: Records | None = None,
) -> bytes:
    """The response frame as a recording may keep it (parts, records: as for
    redact_request)."""
    whole = frame if isinstance(frame, bytes) else None
    secret = api_key in SECRET_RESPONSES
    if whole is not None and not secret and (payloads or api_key not in PAYLOAD_RESPONSES):
        return whole
    head = _first_bytes(frame)
    try:
        body = response_body_offset(head, api_key, api_version)
    except ProtocolError:
        return _head_only(head, SIZE_PREFIX + 4)
    return _redacted(
        frame,
        body,
        records,
        secret=lambda: response_plan(api_key, api_version) if secret else None,
        records_walk=lambda: _response_walk(api_key, api_version),
    )


def _redacted(
    frame: bytes | list[Part],
    body: int,
    records: Records | None,
    secret: Callable[[], StructPlan | None],
    records_walk: Callable[[], tuple[int, Walk, bool]],
) -> bytes:
    """A message that must lose something: its secrets (bytes fields, by its plan), else
    its record data (where the relay's walk found it, else found by walking it again).
    Whatever cannot be cut keeps only its header."""
    try:
        plan = secret()
        if plan is not None:
            if not isinstance(frame, bytes):
                raise MalformedMessage(f"{plan.name} passed partly unread")
            return _cut(frame, plan, body, SECRETS)
        if records is not None:
            return cut_spans(_parts(frame), *records)
        start, steps, compact = records_walk()
        return cut_records(_parts(frame), start, steps, compact)
    except ProtocolError:
        return _head_only(_first_bytes(frame), body)


def _request_walk(api_key: int, api_version: int) -> tuple[int, Walk, bool]:
    plan = carrying_records(api_key, api_version, response=False)
    if plan is None:
        raise MalformedMessage(f"API {api_key} v{api_version} requests carry no records")
    steps = request_walk(plan, request_header_version(api_key, api_version))
    return REQUEST_WALK_START, steps, plan.flexible


def _response_walk(api_key: int, api_version: int) -> tuple[int, Walk, bool]:
    plan = carrying_records(api_key, api_version, response=True)
    if plan is None:
        raise MalformedMessage(f"API {api_key} v{api_version} answers carry no records")
    header_tags = response_header_version(api_key, api_version) == 1
    return RESPONSE_WALK_START, walk(plan, header_tags=header_tags, tail=False), plan.flexible


def _first_bytes(frame: bytes | list[Part]) -> bytes:
    """The frame's bytes up to its first unread run: its header at least."""
    if isinstance(frame, bytes):
        return frame
    first = frame[0]
    return b"" if isinstance(first, int) else bytes(first)


def _parts(frame: bytes | list[Part]) -> list[Part]:
    return [frame] if isinstance(frame, bytes) else frame


def cut_records(parts: Sequence[Part], start: int, steps: Walk, compact: bool) -> bytes:
    """The frame in `parts`, walked by `steps` from `start` (just after its correlation id),
    with each record set that holds data made empty and its size prefix made to fit.
    Record data may be bytes or a run never read (an int); anything else must be bytes.
    Raises ProtocolError when the parts do not follow the walk."""
    reader = _Parts(parts)
    out = bytearray(reader.take(start))
    empty = wire.write_uvarint(1) if compact else wire.write_int32(0)
    try:
        step = next(steps)
        while True:
            if step > 0:
                got = reader.take(step)
                out += got
                step = steps.send(got)
                continue
            if step == TAIL:
                raise MalformedMessage("a recording's walk has no tail to rewrite")
            length = -step  # records: drop their length prefix, taken just before
            prefix = wire.write_uvarint(length + 1) if compact else wire.write_int32(length)
            if out[-len(prefix) :] != prefix:
                raise MalformedMessage("a record set's length is not encoded as Kafka writes it")
            del out[-len(prefix) :]
            out += empty
            reader.skip(length)
            step = next(steps)
    except StopIteration:
        pass
    if reader.left:
        raise MalformedMessage(f"{reader.left} bytes follow the end of the message")
    out[:SIZE_PREFIX] = (len(out) - SIZE_PREFIX).to_bytes(SIZE_PREFIX, "big")
    return bytes(out)


def cut_spans(parts: Sequence[Part], spans: Sequence[tuple[int, int]], compact: bool) -> bytes:
    """The frame in `parts` with the record data at `spans` (offsets in the frame, as the
    relay's walk found them) made empty: each span's length prefix, just before it, is
    replaced too, and the size prefix made to fit. No walk: the relay walked it already.
    Raises ProtocolError when the parts do not fit the spans."""
    reader = _Parts(parts)
    out = bytearray()
    empty = wire.write_uvarint(1) if compact else wire.write_int32(0)
    at = 0
    for start, end in spans:
        length = end - start
        prefix = wire.write_uvarint(length + 1) if compact else wire.write_int32(length)
        if start - len(prefix) < at:
            raise MalformedMessage("record sets overlap")
        out += reader.take(start - len(prefix) - at)
        if reader.take(len(prefix)) != prefix:
            raise MalformedMessage("a record set's length is not where the relay found it")
        out += empty
        reader.skip(length)
        at = end
    out += reader.take(reader.left)
    out[:SIZE_PREFIX] = (len(out) - SIZE_PREFIX).to_bytes(SIZE_PREFIX, "big")
    return bytes(out)


class _Parts:
    """Reading through a frame given as parts: bytes are taken, unread runs only skipped."""

    __slots__ = ("index", "left", "offset", "parts")

    def __init__(self, parts: Sequence[Part]) -> None:
        self.parts = parts
        self.index = 0
        self.offset = 0  # into parts[index]
        self.left = sum(p if isinstance(p, int) else len(p) for p in parts)

    def take(self, size: int) -> bytes:
        if size > self.left:
            raise MalformedMessage("a field runs past the end of its frame")
        taken = bytearray()
        while len(taken) < size:
            part = self.parts[self.index]
            if isinstance(part, int):
                raise MalformedMessage("bytes that passed unread are not record data")
            piece = part[self.offset : self.offset + size - len(taken)]
            taken += piece
            self._advance(len(piece), len(part))
        return bytes(taken)

    def skip(self, size: int) -> None:
        if size > self.left:
            raise MalformedMessage("records run past the end of their frame")
        while size:
            part = self.parts[self.index]
            length = part if isinstance(part, int) else len(part)
            step = min(size, length - self.offset)
            self._advance(step, length)
            size -= step

    def _advance(self, count: int, length: int) -> None:
        self.offset += count
        self.left -= count
        if self.offset == length:
            self.index += 1
            self.offset = 0
