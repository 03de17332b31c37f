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

The walk is a generator of steps: n > 0 asks for the next n bytes (sent back into the
generator, passed on unchanged); n < 0 lets -n bytes of record data pass unread (only
records ever do); TAIL asks for the rest of the frame, the top-level tagged fields, which
rewrite_tail() then rewrites. The same walks, without TAIL, let a recording tunnel splice
the records of any message that carries them (a Produce request's walked from its body)
while it reads everything else.
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
    FIXED,
    FIXED_ARRAY,
    STRUCT,
    STRUCT_ARRAY,
    VARIABLE,
    VARIABLE_ARRAY,
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
Got = bytes | memoryview  # the bytes a step asked for, as they lie
Walk = Generator[int, Got | None, None]


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


def walk(plan: StructPlan, *, header_tags: bool = True, tail: bool = True) -> Walk:
    """The steps of one message: a response's header tagged fields (header_tags: response
    header v1; the walk then starts after the correlation id), the body's fields (a
    request's walk starts at its body), then TAIL for the top-level tagged fields to be
    rewritten, or (tail=False) those fields walked like the rest.

    One generator over an explicit stack of what is left to walk, not a generator per
    struct and field: a step resumes one frame (a compact length is read in this loop
    too), which is what a recording tunnel pays per field of every Produce request and
    Fetch answer."""
    todo: list[object] = [TAIL] if tail else [_TAGS] if plan.flexible else []
    todo += reversed(plan.steps)  # runs of fixed-size fields are one step each
    if header_tags:
        todo.append(_TAGS)
    while todo:
        item = todo.pop()
        kind = item.__class__
        if kind is int:  # fixed-size fields, or TAIL (0)
            yield item  # type: ignore[misc]
        elif kind is FieldPlan:
            field: FieldPlan = item  # type: ignore[assignment]
            form = field.kind
            if not field.compact or form is FIXED or form is STRUCT:
                yield from _field(field, todo)
                continue
            # A compact length or count, read here rather than through _field, _length
            # and _uvarint: each of those generators is a frame to resume for every byte.
            byte = (yield 1)[0]  # type: ignore[index]
            length = (byte if byte < 0x80 else (yield from _uvarint_after(byte))) - 1
            if length <= 0:
                if length == 0 or (length == -1 and field.nullable):
                    continue
                raise MalformedMessage(f"{field.name} has length {length}")
            if form is VARIABLE:
                yield -length if field.kafka_type == "records" else length
            elif form is STRUCT_ARRAY:
                todo.append(_Repeat(length, field.struct))  # type: ignore[arg-type]
            elif form is FIXED_ARRAY:
                yield length * field.size
            else:
                todo.append(_Repeat(length, _Element(field)))
        elif kind is StructPlan:
            if item.flexible:  # type: ignore[attr-defined]
                todo.append(_TAGS)  # below the top level they name no broker (see streamable)
            todo += reversed(item.steps)  # type: ignore[attr-defined]
        elif kind is _Repeat:
            repeat: _Repeat = item  # type: ignore[assignment]
            if repeat.times > 1:
                todo.append(_Repeat(repeat.times - 1, repeat.element))
            todo.append(repeat.element)
        elif kind is _Element:
            yield from _variable(item.field)  # type: ignore[attr-defined]
        else:  # _TAGS
            count = (yield 1)[0]  # type: ignore[index]
            if not count:  # the usual case: no tagged fields
                continue
            if count >= 0x80:
                count = yield from _uvarint_after(count)
            for _ in range(count):
                yield from _uvarint()  # the tag
                size = yield from _uvarint()
                if size:
                    yield size


def _field(field: FieldPlan, todo: list[object]) -> Walk:
    """Walk a field that is not a run of fixed-size ones: what it holds goes on `todo`."""
    kind = field.kind
    if kind is VARIABLE:
        yield from _variable(field)
    elif kind is STRUCT:
        assert field.struct is not None
        present = True
        if field.nullable:
            marker = (yield 1)[0]  # type: ignore[index]
            if marker not in (0xFF, 1):
                raise MalformedMessage(f"nullable struct {field.name} has marker {marker}")
            present = marker == 1
        if present:
            todo.append(field.struct)
    elif kind is FIXED:
        yield field.size
    else:
        count = yield from _length(field, width=4)
        if not count:
            return
        if kind is FIXED_ARRAY:
            yield count * field.size
        elif kind is VARIABLE_ARRAY:
            todo.append(_Repeat(count, _Element(field)))
        else:
            assert field.struct is not None
            todo.append(_Repeat(count, field.struct))


def _variable(field: FieldPlan) -> Walk:
    length = yield from _length(field, width=2 if field.kafka_type == "string" else 4)
    if length:
        yield -length if field.kafka_type == "records" else length


def _length(field: FieldPlan, width: int) -> Generator[int, Got | None, int]:
    """A length or count (null: 0), compact (a uvarint, plus one) or of `width` bytes."""
    if field.compact:
        length = (yield from _uvarint()) - 1
    else:
        data = yield width
        assert data is not None
        length = int.from_bytes(data, "big", signed=True)
    if length < -1 or (length == -1 and not field.nullable):
        raise MalformedMessage(f"{field.name} has length {length}")
    return max(length, 0)


def _uvarint() -> Generator[int, Got | None, int]:
    return (yield from _uvarint_after((yield 1)[0]))  # type: ignore[index]


def _uvarint_after(first: int) -> Generator[int, Got | None, int]:
    """The rest of a varint whose first byte was `first`."""
    value, shift, byte = 0, 0, first
    for _ in range(4):
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
        byte = (yield 1)[0]  # type: ignore[index]
    if byte & 0x80:
        raise MalformedMessage("a varint is longer than 5 bytes")
    return value | (byte << shift)


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
