"""What a recording must not keep: credentials always, record data unless asked.

SaslAuthenticate carries passwords (PLAIN) and proofs (SCRAM); the delegation-token and
SCRAM-credential APIs carry secrets too: every bytes field of those messages is emptied.
Requests that set configs (CreateTopics, AlterConfigs, IncrementalAlterConfigs) may set
passwords (`sasl.jaas.config`, `ssl.keystore.password`): their config values are nulled,
their names kept. (Raw SASL tokens after a SaslHandshake v0 are never written: see trace.)
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

from collections.abc import Sequence

from kafkatunnel.protocol import (
    RESPONSE_WALK_START,
    SIZE_PREFIX,
    TAIL,
    ByteWalk,
    FieldPlan,
    MalformedMessage,
    Part,
    ProtocolError,
    RecordSpans,
    RequestHeader,
    StructPlan,
    Walk,
    carrying_records,
    request_plan,
    response_body_offset,
    response_header_version,
    response_plan,
    splice,
    walk,
    wire,
)

SASL_AUTHENTICATE = 36
# + RenewDelegationToken, ExpireDelegationToken, AlterUserScramCredentials requests, and
# Envelope (a whole forwarded request, any of these among them; brokers send it to the
# controller, a client never should)
SECRET_REQUESTS = {SASL_AUTHENTICATE, 39, 40, 51, 58}
# + CreateDelegationToken, DescribeDelegationToken and Envelope responses
SECRET_RESPONSES = {SASL_AUTHENTICATE, 38, 41, 58}
# CreateTopics, AlterConfigs, IncrementalAlterConfigs: config values, which can be secrets
CONFIG_REQUESTS = {19, 33, 44}
CONFIG_VALUES = frozenset({"value"})
PAYLOAD_REQUESTS = {0}  # Produce
PAYLOAD_RESPONSES = {1, 78}  # Fetch, ShareFetch


class _Cut(ByteWalk):
    """Walks a whole message, replacing the variable-length fields of the chosen types or
    names."""

    __slots__ = ("kinds", "names")

    def __init__(
        self, buf: bytes, kinds: frozenset[str], names: frozenset[str] = frozenset()
    ) -> None:
        super().__init__(buf, _keep)
        self.kinds = kinds
        self.names = names

    def variable(self, field: FieldPlan, pos: int) -> int:
        end = super().variable(field, pos)
        if field.kafka_type in self.kinds or field.name in self.names:
            self.edits.append((pos, end, _empty(field)))
        return end


def _keep(_address: object) -> None:
    return None


def _empty(field: FieldPlan) -> bytes:
    """Null (or, where null is not allowed, empty) in the field's own length encoding."""
    if field.compact:
        return wire.write_uvarint(0 if field.nullable else 1)
    width = 2 if field.kafka_type == "string" else 4  # a string's length is an int16
    return (-1 if field.nullable else 0).to_bytes(width, "big", signed=True)


def _cut(
    frame: bytes,
    plan: StructPlan,
    body: int,
    kinds: frozenset[str],
    names: frozenset[str] = frozenset(),
) -> bytes:
    walk = _Cut(frame, kinds, names)
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
    records: RecordSpans | None = None,
) -> bytes:
    """The request frame as a recording may keep it. A frame given as parts (some of its
    record data passed unread) must be one whose records are cut; `records`, where the
    relay's walk found them, spares walking it again."""
    key, version, body = header.api_key, header.api_version, header.body_offset
    return _redact(frame, key, version, False, body, payloads, records)


def redact_response(
    frame: bytes | list[Part],
    api_key: int,
    api_version: int,
    payloads: bool = False,
    records: RecordSpans | None = None,
) -> bytes:
    """The response frame as a recording may keep it (parts, records: as for
    redact_request)."""
    return _redact(frame, api_key, api_version, True, None, payloads, records)


def _redact(
    frame: bytes | list[Part],
    key: int,
    version: int,
    response: bool,
    request_body: int | None,
    payloads: bool,
    records: RecordSpans | None,
) -> bytes:
    """Secrets cut by the message's plan; else record data cut where the relay's walk
    found it, or found by walking the message again; whatever cannot be cut keeps only its
    header (fail closed). request_body: where a request's body starts (None: unknown); a
    response's header says where its body starts."""
    configs = not response and key in CONFIG_REQUESTS
    secret = configs or key in (SECRET_RESPONSES if response else SECRET_REQUESTS)
    payload = key in (PAYLOAD_RESPONSES if response else PAYLOAD_REQUESTS)
    if isinstance(frame, bytes) and not secret and (payloads or not payload):
        return frame  # most frames are kept whole
    if records is not None and not secret:
        try:  # the usual recorded Produce request or Fetch answer: cut where the relay found
            return cut_unread(_parts(frame), *records)
        except ProtocolError:
            pass  # and fail closed below
    head = _first_bytes(frame)
    body = request_body if not response else _response_body(head, key, version)
    if body is None:  # the header cannot be read: keep what surely is header
        return _head_only(head, min(len(head), SIZE_PREFIX + (4 if response else 8)))
    try:
        if secret:
            if not isinstance(frame, bytes):
                raise MalformedMessage(f"API {key} v{version} passed partly unread")
            plan = (response_plan if response else request_plan)(key, version)
            if configs:
                return _cut(frame, plan, body, frozenset(), CONFIG_VALUES)
            return _cut(frame, plan, body, SECRETS)
        if records is not None:
            raise MalformedMessage("the record sets are not where the relay's walk found them")
        found = carrying_records(key, version, response)
        if found is None:
            raise MalformedMessage(f"API {key} v{version} carries no records")
        tags = response and response_header_version(key, version) == 1
        steps = walk(found, header_tags=tags, tail=False)
        start = RESPONSE_WALK_START if response else body  # a request's header is read
        return cut_records(_parts(frame), start, steps, found.flexible)
    except ProtocolError:
        return _head_only(head, body)


def _response_body(head: bytes, api_key: int, api_version: int) -> int | None:
    try:
        return response_body_offset(head, api_key, api_version)
    except ProtocolError:
        return None


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
    sent = b""  # bytes sent to the walk that it has not read yet
    try:
        used, step = next(steps)
        while True:
            if step > 0:  # at least `step` bytes, or all that may be read (see streaming.Walk:
                # a length asks for a varint's five, and the record data after it is unread)
                sent += reader.take(min(max(step - len(sent), 0), reader.readable))
            elif step == TAIL:
                raise MalformedMessage("a recording's walk has no tail to rewrite")
            else:
                length = -step  # records: drop their length prefix, read just before
                prefix = wire.write_uvarint(length + 1) if compact else wire.write_int32(length)
                if out[-len(prefix) :] != prefix:
                    raise MalformedMessage(
                        "a record set's length is not encoded as Kafka writes it"
                    )
                del out[-len(prefix) :]
                out += empty
                reader.skip(length - min(length, len(sent)))
                sent = sent[length:]  # the walk asks for what follows
            used, step = steps.send(sent)
            out += sent[:used]
            sent = sent[used:]
    except StopIteration as end:
        out += sent[: end.value]
        sent = sent[end.value :]
    if sent or reader.left:
        raise MalformedMessage(f"{len(sent) + reader.left} bytes follow the end of the message")
    out[:SIZE_PREFIX] = (len(out) - SIZE_PREFIX).to_bytes(SIZE_PREFIX, "big")
    return bytes(out)


def cut_unread(parts: Sequence[Part], spans: Sequence[tuple[int, int]], compact: bool) -> bytes:
    """The frame in `parts` with its record data made empty: each run that passed unread
    (an int) is the record set the relay's walk found at the next of `spans`; its length
    prefix, just before it, is replaced too, and the size prefix made to fit. No walk: the
    relay walked it already, and only the bytes kept are looked at (a recording does this
    for every Produce request and Fetch answer). Raises ProtocolError when the parts do not
    fit the spans."""
    out = bytearray()
    at = 0  # offset in the frame
    found = iter(spans)
    empty = _EMPTY_COMPACT if compact else _EMPTY_INT32
    for part in parts:
        if not isinstance(part, int):
            out += part
            at += len(part)
            continue
        length = part
        if next(found, None) != (at, at + length):
            raise MalformedMessage("bytes passed unread where the walk found no records")
        prefix = wire.write_uvarint(length + 1) if compact else length.to_bytes(4, "big")
        if out[-len(prefix) :] != prefix:
            raise MalformedMessage("a record set's length is not where the relay found it")
        out[-len(prefix) :] = empty
        at += length
    if next(found, None) is not None or len(out) < SIZE_PREFIX:
        raise MalformedMessage("record data the walk found was read, or the frame is cut short")
    out[:SIZE_PREFIX] = (len(out) - SIZE_PREFIX).to_bytes(SIZE_PREFIX, "big")
    return bytes(out)


_EMPTY_COMPACT = wire.write_uvarint(1)
_EMPTY_INT32 = wire.write_int32(0)


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
        if not size:
            return b""
        part = self.parts[self.index]
        if not isinstance(part, int) and self.offset + size <= len(part):  # the usual case
            piece = bytes(part[self.offset : self.offset + size])
            self._advance(size, len(part))
            return piece
        taken = bytearray()
        while len(taken) < size:
            part = self.parts[self.index]
            if isinstance(part, int):
                raise MalformedMessage("bytes that passed unread are not record data")
            more = part[self.offset : self.offset + size - len(taken)]
            taken += more
            self._advance(len(more), len(part))
        return bytes(taken)

    @property
    def readable(self) -> int:
        """Bytes that may be taken from here on: up to the next run never read."""
        count, offset = 0, self.offset
        for part in self.parts[self.index :]:
            if isinstance(part, int):
                break
            count += len(part) - offset
            offset = 0
        return count

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
