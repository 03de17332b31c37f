"""Rewriting a record-carrying response while it is still arriving.

A Fetch answer from v16 on can name brokers, but only in its last bytes: the top-level
tagged field NodeEndpoints (KIP-951, leaders that moved). Holding a megabyte of records to
rewrite a few bytes after them would copy every record through Python and delay the answer
by its whole length. Instead the answer is walked as it arrives, by its schema: the headers
of topics and partitions are read (they are small), the record batches pass unread (the I/O
layer may splice them), and only the tagged fields at the very end are held and rewritten.

The size prefix went out first, so the rewritten tail keeps the tail's exact length. A
shorter one is padded with an unknown tagged field (which every Kafka parser skips, as
KIP-482 asks); one that would be longer drops NodeEndpoints instead, so the client asks for
Metadata, as clients did before KIP-951. Either way the client never sees an in-cluster
address.

The walk is a generator of steps over the frame's bytes as they arrive. Sent the bytes on
hand, it reads every field they hold and says how many it read and its next step: n > 0,
the next n bytes are needed to go on (or what is left of the frame, if less); n < 0, -n
bytes of record data pass unread (only records ever do); TAIL, the rest of the frame, the
top-level tagged fields, which rewrite_tail() then rewrites. The same walks, without TAIL,
let a recording tunnel splice the records of any message that carries them (a Produce
request's walked from its body) while it reads everything else.
"""

from __future__ import annotations

import functools
from collections.abc import Generator
from typing import NamedTuple

from kafkatunnel.protocol import wire
from kafkatunnel.protocol.errors import MalformedMessage, UnknownApiKey, UnsupportedVersion
from kafkatunnel.protocol.framing import SIZE_PREFIX
from kafkatunnel.protocol.headers import response_header_version
from kafkatunnel.protocol.rewrite import BrokerAddress, ByteWalk, Mapper, keep_address, splice
from kafkatunnel.protocol.schema import (
    FIXED_ARRAY,
    STRUCT,
    STRUCT_ARRAY,
    VARIABLE,
    FieldPlan,
    StructPlan,
    request_plan,
    response_plan,
)

TAIL = 0
RESPONSE_WALK_START = SIZE_PREFIX + 4  # a response's walk starts after its correlation id
# Tags for padding, after every tag Kafka defines: the largest of two and of three bytes
# (a varint's width steps at 128, so one width alone cannot pad to every size).
PADDING_TAGS = (0x3FFF, 0x1FFFFF)
Got = bytes | memoryview  # bytes of the frame sent to a walk, as they lie
# What a walk says after each resume: how many of the bytes sent it has read, and its next
# step. Sent: the frame's bytes from there on, as many as are on hand, at least the step's
# n or what is left of the frame if less (a walk sent fewer knows the frame ends first).
Step = tuple[int, int]
Walk = Generator[Step, Got, int]


@functools.cache
def streamable(api_key: int, api_version: int) -> StructPlan | None:
    """The plan of a response that carries records and names brokers only in its top-level
    tagged fields (Fetch v16+): such a response can be rewritten as it streams."""
    try:
        plan = response_plan(api_key, api_version)
    except (UnknownApiKey, UnsupportedVersion):
        return None
    if response_header_version(api_key, api_version) != 1 or not plan.tagged_addresses:
        return None
    if any(_names_brokers(f) for f in plan.fields) or not any(map(_has_records, plan.fields)):
        return None
    return plan


@functools.cache
def carrying_records(api_key: int, api_version: int, response: bool) -> StructPlan | None:
    """The plan of a request or response that carries record data (Produce requests,
    Fetch and ShareFetch answers): a recording walks these so that only the records pass
    unread."""
    try:
        plan = (response_plan if response else request_plan)(api_key, api_version)
    except (UnknownApiKey, UnsupportedVersion):
        return None
    return plan if any(map(_has_records, plan.fields)) else None


def _names_brokers(field: FieldPlan) -> bool:
    return field.struct is not None and field.struct.has_addresses


def _has_records(field: FieldPlan) -> bool:
    if field.kafka_type == "records":
        return True
    return field.struct is not None and any(map(_has_records, field.struct.fields))


class _Repeat(NamedTuple):
    """`times` more elements of an array still to walk (pushed lazily: a count read from
    the wire may be anything)."""

    times: int
    element: StructPlan | _Element


class _Element(NamedTuple):
    """One element of an array of strings or bytes."""

    field: FieldPlan


_TAGS = object()  # a tagged-field section
_VARINT = 5  # bytes a varint may take, at the most
# A walk's first bytes, and those after record data, are sent without being asked for:
# best at least this many (or what is left of the frame), so that a length or count that
# follows is read at once; a walk sent fewer asks for the rest.
AFTER_RECORDS = _VARINT


def walk(plan: StructPlan, *, header_tags: bool = True, tail: bool = True, after: int = 0) -> Walk:
    """The steps of one message: a response's header tagged fields (header_tags: response
    header v1; the walk then starts after the correlation id), the body's fields (a
    request's walk starts at its body, or `after` its first steps: a Produce request's
    transactional id, read and changed by its caller), then TAIL for the top-level tagged
    fields to be rewritten, or (tail=False) those fields walked like the rest.

    Each resume reads every field whose bytes it was sent: the head of a 1 MB Produce
    request is one resume up to its records, not one per field (what a recording tunnel
    pays for every Produce request and Fetch answer). One generator over an explicit stack
    of what is left to walk, not a generator per struct and field; a varint or a length
    is read inline, the bytes on hand checked first."""
    todo: list[object] = [TAIL] if tail else [_TAGS] if plan.flexible else []
    todo += reversed(plan.steps[after:])  # runs of fixed-size fields are one step each
    if header_tags:
        todo.append(_TAGS)
    buf = yield 0, AFTER_RECORDS  # the bytes last sent; those before pos are walked
    pos, end = 0, len(buf)
    while todo:
        item = todo.pop()
        kind = item.__class__
        if kind is int:  # fixed-size fields, or TAIL (0)
            if not item:
                yield pos, TAIL
                return pos
            if end - pos < item:  # type: ignore[operator]
                buf, pos, end = yield from _more(buf, pos, item)  # type: ignore[arg-type]
            pos += item  # type: ignore[operator]
            continue
        if kind is StructPlan:
            if item.flexible:  # type: ignore[attr-defined]
                todo.append(_TAGS)  # below the top level they name no broker (see streamable)
            todo += reversed(item.steps)  # type: ignore[attr-defined]
            continue
        if kind is _Repeat:
            repeat: _Repeat = item  # type: ignore[assignment]
            if repeat.times > 1:
                todo.append(_Repeat(repeat.times - 1, repeat.element))
            todo.append(repeat.element)
            continue
        if kind is _Element:
            field: FieldPlan = item.field  # type: ignore[attr-defined]
            form = VARIABLE
        elif kind is FieldPlan:
            field = item  # type: ignore[assignment]
            form = field.kind
        else:  # _TAGS
            if pos < end and not buf[pos]:  # the usual case: no tagged fields
                pos += 1
            else:
                buf, pos, end = yield from _skip_tagged_fields(buf, pos, end)
            continue
        if form is STRUCT:
            assert field.struct is not None
            if field.nullable:
                if pos == end:
                    buf, pos, end = yield from _more(buf, pos, 1)
                marker = buf[pos]
                pos += 1
                if marker not in (0xFF, 1):
                    raise MalformedMessage(f"nullable struct {field.name} has marker {marker}")
                if marker != 1:
                    continue
            todo.append(field.struct)
            continue
        # A length or count: compact (a uvarint, plus one) or of 2 or 4 bytes.
        if field.compact:
            if pos < end and buf[pos] < 0x80:
                length = buf[pos] - 1
                pos += 1
            else:
                length, buf, pos, end = yield from _uvarint(buf, pos, end)
                length -= 1
        else:
            width = 2 if form is VARIABLE and field.kafka_type == "string" else 4
            if end - pos < width:
                buf, pos, end = yield from _more(buf, pos, width)
            length = int.from_bytes(buf[pos : pos + width], "big", signed=True)
            pos += width
        if length <= 0:
            if length == 0 or (length == -1 and field.nullable):
                continue
            raise MalformedMessage(f"{field.name} has length {length}")
        if form is VARIABLE:
            if field.kafka_type == "records":  # passes unread; then what follows is sent
                buf = yield pos, -length
                pos, end = 0, len(buf)
                continue
            if end - pos < length:
                buf, pos, end = yield from _more(buf, pos, length)
            pos += length
        elif form is STRUCT_ARRAY:
            todo.append(field.struct if length == 1 else _Repeat(length, field.struct))  # type: ignore[arg-type]
        elif form is FIXED_ARRAY:
            length *= field.size
            if end - pos < length:
                buf, pos, end = yield from _more(buf, pos, length)
            pos += length
        else:
            todo.append(_Repeat(length, _Element(field)))
    return pos


def _skip_tagged_fields(buf: Got, pos: int, end: int) -> Generator[Step, Got, tuple[Got, int, int]]:
    """Step over a tagged-field section (KIP-482): a count, then each field's tag, size and
    bytes."""
    count, buf, pos, end = yield from _uvarint(buf, pos, end)
    for _ in range(count):
        _tag, buf, pos, end = yield from _uvarint(buf, pos, end)
        size, buf, pos, end = yield from _uvarint(buf, pos, end)
        if end - pos < size:
            buf, pos, end = yield from _more(buf, pos, size)
        pos += size
    return buf, pos, end


def _more(buf: Got, pos: int, need: int) -> Generator[Step, Got, tuple[Got, int, int]]:
    """Ask for `need` bytes from pos on (the walk has fewer): the bytes then sent, from 0."""
    buf = yield pos, need
    if len(buf) < need:  # the frame ends first (see Walk)
        raise MalformedMessage("a field runs past the end of its frame")
    return buf, 0, len(buf)


def _uvarint(buf: Got, pos: int, end: int) -> Generator[Step, Got, tuple[int, Got, int, int]]:
    """The uvarint at pos, asking for more bytes if buf ends inside it, and the bytes and
    position after it."""
    value, after = _uvarint_in(buf, pos, end)
    if after < 0:
        buf = yield pos, _VARINT
        pos, end = 0, len(buf)
        value, after = _uvarint_in(buf, 0, end)
        if after < 0:
            raise MalformedMessage("a field runs past the end of its frame")
    return value, buf, after, end


def _uvarint_in(buf: Got, pos: int, end: int) -> tuple[int, int]:
    """The uvarint at buf[pos:end] and the position after it; (0, -1) if it goes on past end."""
    value = shift = 0
    for at in range(pos, min(end, pos + _VARINT)):
        byte = buf[at]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at + 1
        shift += 7
    if end - pos >= _VARINT:
        raise MalformedMessage("a varint is longer than 5 bytes")
    return 0, -1


def rewrite_tail(
    tail: bytes, plan: StructPlan, mapper: Mapper
) -> tuple[bytes, tuple[BrokerAddress, ...]]:
    """The top-level tagged fields with their broker addresses rewritten, in exactly
    len(tail) bytes, and the addresses they named. May raise UnknownBroker (from mapper)."""
    framed = bytes(4) + tail  # ByteWalk and splice() speak frames: a size prefix first
    walker = ByteWalk(framed, mapper)
    if walker.tagged(plan, 4, None) != len(framed):
        raise MalformedMessage(f"{plan.name} has bytes after its tagged fields")
    seen = tuple(walker.seen)
    if not walker.edits:
        return tail, seen
    padded = _pad(splice(framed, walker.edits)[4:], len(tail))
    return (padded if padded is not None else _without_addresses(tail, plan)), seen


def addresses_in_tail(tail: bytes, plan: StructPlan) -> tuple[BrokerAddress, ...]:
    """Every broker address the top-level tagged fields name, changing nothing."""
    return rewrite_tail(tail, plan, keep_address)[1]


def _without_addresses(tail: bytes, plan: StructPlan) -> bytes:
    """The tagged fields without those that can name a broker, padded to len(tail)."""
    kept = [
        tail[f.start : f.end]
        for f in wire.tagged_fields(tail, 0)
        if f.tag not in plan.tagged or not _names_brokers(plan.tagged[f.tag])
    ]
    fields = wire.write_uvarint(len(kept)) + b"".join(kept)
    padded = _pad(fields, len(tail))
    if padded is None:  # a dropped field takes at least 3 bytes, a padding field at most
        raise MalformedMessage(f"cannot fit {plan.name}'s tagged fields in {len(tail)} bytes")
    return padded


def _pad(fields: bytes, size: int) -> bytes | None:
    """Tagged fields (count first) grown to exactly `size` bytes by one padding field, or
    None if they cannot be."""
    if len(fields) == size:
        return fields
    count, pos = wire.read_uvarint(fields, 0)
    body = fields[pos:]
    for tag in PADDING_TAGS:
        head = wire.write_uvarint(count + 1) + body + wire.write_uvarint(tag)
        for length_bytes in (1, 2, 3):
            filler = size - len(head) - length_bytes
            if filler >= 0 and len(wire.write_uvarint(filler)) == length_bytes:
                return head + wire.write_uvarint(filler) + bytes(filler)
    return None
