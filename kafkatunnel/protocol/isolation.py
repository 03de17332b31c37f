"""Isolated ids (`up --isolate`): every consumer-group, share-group and transactional id a
client sends becomes its isolated form (`orders` -> `orders.kt-alice`) in every request
that carries one, and back in the answers, so a local run of a deployed application never
joins, fences or drains what the deployed one owns, and still sees its own names.

Which fields hold such an id comes from kio's schemas (generated from Kafka's JSON
definitions, whose `entityType` kio keeps as the GroupId and TransactionalId types), not
from a list written here; FindCoordinator's keys are plain strings there and are added by
name. Answers that list the cluster's ids (ListGroups, ListTransactions) are left as they
are: they describe the cluster, where the deployed group and the isolated one both exist.
The share-group state APIs (InitializeShareGroupState and the like) are sent by brokers to
brokers, never by a client: their group ids pass untouched.

Sans-I/O: functions over frame bytes. A message is walked by the same plans the address
rewriter uses, only the id strings are replaced, everything else (unknown tagged fields
among it) is kept byte for byte.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import struct
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.schema.types import GroupId, TransactionalId

from kafkatunnel.protocol import wire
from kafkatunnel.protocol.api_versions import UNKNOWN_APIS, readable_caps
from kafkatunnel.protocol.errors import MalformedMessage
from kafkatunnel.protocol.framing import SIZE_PREFIX
from kafkatunnel.protocol.headers import response_body_offset
from kafkatunnel.protocol.rewrite import ByteWalk, Edit, splice
from kafkatunnel.protocol.schema import (
    STRUCT,
    STRUCT_ARRAY,
    VARIABLE,
    VARIABLE_ARRAY,
    FieldPlan,
    StructPlan,
    struct_plan,
)

ID_TYPES = (GroupId, TransactionalId)
FIND_COORDINATOR_KEYS = frozenset({"key", "coordinator_keys"})  # kio types them as str
# Answers that list the cluster's ids: kept as the cluster has them (see the docstring)
LISTING_ANSWERS = frozenset({16, 66})  # ListGroups, ListTransactions
# Sent broker to broker (the share coordinator's state): a client never sends them
BROKER_ONLY = frozenset({83, 84, 85, 86, 87})
SEPARATOR = "."
PRODUCE = 0
FIRST_FIELD = frozenset({0})  # where Produce has its transactional id
_SIZE = struct.Struct(">i")
# The group ids noted (for status and `down --clean`): a developer's application uses a
# handful; a client naming thousands would otherwise grow the tunnel without end.
GROUPS_NOTED = 1000
SUFFIX = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")


def check_suffix(suffix: str) -> str:
    """The suffix as given, if Kafka's legal name characters (letters, digits, `.`, `_`,
    `-`) and at most 64 of them; ValueError saying so otherwise."""
    if not SUFFIX.fullmatch(suffix):
        raise ValueError(
            f"--isolate-suffix {suffix!r}: use 1 to 64 of Kafka's name characters "
            "(letters, digits, '.', '_', '-'), not starting with '.'"
        )
    return suffix


@dataclass(frozen=True, slots=True)
class Isolation:
    """The mapping of one tunnel: `name` <-> `name.suffix`; from_deployed: an isolated
    consumer starts at the deployed group's committed offsets (deployed_offsets)."""

    suffix: str
    from_deployed: bool = False

    def __post_init__(self) -> None:
        check_suffix(self.suffix)

    def isolated(self, name: str) -> str:
        return f"{name}{SEPARATOR}{self.suffix}"

    def original(self, name: str) -> str | None:
        """The name the client used, for an isolated id; None for any other."""
        tail = SEPARATOR + self.suffix
        return name[: -len(tail)] if name.endswith(tail) else None


@dataclass(frozen=True, slots=True)
class IdPlan:
    """Where ids sit in one struct: field indexes holding an id (a string, or an array of
    them), those of them that name a group (GroupId), and the struct fields with ids
    below."""

    plan: StructPlan
    ids: frozenset[int]
    inner: Mapping[int, IdPlan]
    groups: frozenset[int] = frozenset()


def _base(hint: Any) -> Any:
    """`X | None`, `tuple[X, ...]`, `tuple[X | None, ...] | None` -> X."""
    for _ in range(3):
        if typing.get_origin(hint) in (types.UnionType, typing.Union):
            rest = [a for a in typing.get_args(hint) if a is not type(None)]
            hint = rest[0] if len(rest) == 1 else hint
        elif typing.get_origin(hint) is tuple:
            hint = typing.get_args(hint)[0]
    return hint


def _holds_id(entity: type, field: dataclasses.Field[Any], base: Any) -> bool:
    if base in ID_TYPES:
        return True
    return entity.__module__.startswith("kio.schema.find_coordinator.") and (
        field.name in FIND_COORDINATOR_KEYS
    )


@functools.cache
def id_plan(entity: type) -> IdPlan | None:
    """The IdPlan of a kio entity class; None when no id is in it or below it."""
    plan = struct_plan(entity)
    hints = typing.get_type_hints(entity)
    ids: set[int] = set()
    groups: set[int] = set()
    inner: dict[int, IdPlan] = {}
    index = 0
    for field in dataclasses.fields(entity):
        base = _base(hints[field.name])
        sub = id_plan(base) if isinstance(base, type) and dataclasses.is_dataclass(base) else None
        holds = _holds_id(entity, field, base)
        if field.metadata.get("tag") is not None:
            if holds or sub is not None:  # none in Kafka's schemas so far
                raise NotImplementedError(
                    f"{entity.__module__}.{entity.__name__}.{field.name}: a tagged field "
                    "holding a group or transactional id, which isolation does not map yet"
                )
            continue
        if holds:
            ids.add(index)
            if base is GroupId:
                groups.add(index)
        elif sub is not None:
            inner[index] = sub
        index += 1
    if not (ids or inner):
        return None
    return IdPlan(plan, frozenset(ids), inner, frozenset(groups))


def _versions(api_key: int) -> Any:
    return schema_name_map.get(api_key_map.get(api_key, ""), {})


def isolating_caps() -> dict[int, range]:
    """What clients of an isolating tunnel may use: every API at the versions kio knows,
    and no API it does not know (ApiVersions answers capped so). A version or an API newer
    than these schemas could carry an id this module cannot see: it would reach the
    cluster as the deployed application's."""
    return {**readable_caps(), UNKNOWN_APIS: range(0)}


def request_ids(api_key: int, version: int) -> IdPlan | None:
    """Where a request of this API and version carries ids; None: nowhere (or a version
    kio does not know, or an API only brokers send)."""
    if api_key in BROKER_ONLY or version not in _versions(api_key):
        return None
    return id_plan(load_request_schema(api_key, version))


def response_ids(api_key: int, version: int) -> IdPlan | None:
    """Where an answer of this API and version carries ids to map back (None for listing
    answers, see the docstring)."""
    if api_key in BROKER_ONLY | LISTING_ANSWERS or version not in _versions(api_key):
        return None
    return id_plan(load_response_schema(api_key, version))


def isolate_request(
    frame: bytes,
    api_key: int,
    api_version: int,
    body_offset: int,
    isolation: Isolation,
    groups: set[str] | None = None,
) -> bytes:
    """The request frame with every id it carries isolated (the same object when it
    carries none); the group ids it names, as the client named them, are added to
    `groups`. Raises ProtocolError when it cannot be walked."""
    plan = request_ids(api_key, api_version)
    if plan is None:
        return frame
    return _rewrite(frame, plan, body_offset, isolation.isolated, groups)


def isolate_produce_head(
    head: bytes, body_offset: int, api_version: int, isolation: Isolation
) -> tuple[bytes, int] | None:
    """A Produce request's transactional id is its first field, ahead of its records: what
    to send instead of `head[:used]` (the size prefix grown by as many bytes as the id
    grew, the header, the isolated id), and `used`, so that the records pass on unread;
    None when the request has no transactional id. MalformedMessage when `head` ends
    before the id does (the caller holds the frame whole, or it is malformed)."""
    plan = request_ids(PRODUCE, api_version)
    if plan is None or plan.ids != FIRST_FIELD:  # before v3: no transactional id
        return None
    compact = plan.plan.flexible
    name, used = wire.read_string(head, body_offset, compact)
    if name is None:
        return None
    (size,) = _SIZE.unpack_from(head, 0)
    written = wire.write_string(isolation.isolated(name), compact)
    grown = size + len(written) - (used - body_offset)
    return _SIZE.pack(grown) + head[SIZE_PREFIX:body_offset] + written, used


def restore_response(frame: bytes, api_key: int, api_version: int, isolation: Isolation) -> bytes:
    """The answer frame with every isolated id it carries back as the client named it (the
    same object when there is none)."""
    plan = response_ids(api_key, api_version)
    if plan is None:
        return frame
    body = response_body_offset(frame, api_key, api_version)
    return _rewrite(frame, plan, body, isolation.original)


def _rewrite(
    frame: bytes,
    plan: IdPlan,
    body: int,
    change: Callable[[str], str | None],
    groups: set[str] | None = None,
) -> bytes:
    walk = _IdWalk(frame, change, groups)
    end = walk.struct(plan, body)
    if end != len(frame):
        raise MalformedMessage(f"{plan.plan.name} ends {len(frame) - end} bytes early")
    return splice(frame, walk.edits) if walk.edits else frame


def _no_address(_address: object) -> None:
    return None


class _IdWalk:
    """Walks a message by its IdPlan, replacing id strings (`change` gives the new one, or
    None to keep it); everything else is skipped by the address walk's own steps."""

    def __init__(
        self, buf: bytes, change: Callable[[str], str | None], groups: set[str] | None
    ) -> None:
        self.buf = buf
        self.change = change
        self.groups = groups  # the group ids met, as they were
        self.edits: list[Edit] = []
        self.skip = ByteWalk(buf, _no_address)

    def struct(self, ids: IdPlan, pos: int) -> int:
        plan = ids.plan
        for index, field in enumerate(plan.fields):
            if index in ids.ids:
                pos = self.id_field(field, pos, index in ids.groups)
            elif index in ids.inner:
                pos = self.structs(field, ids.inner[index], pos)
            else:
                pos = self.skip.field(field, pos, None)
        if plan.flexible:  # no tagged field holds an id (id_plan): kept byte for byte
            pos = self.tagged(pos)
        return pos

    def tagged(self, pos: int) -> int:
        buf = self.buf
        return pos + 1 if pos < len(buf) and buf[pos] == 0 else wire.skip_tagged_fields(buf, pos)

    def structs(self, field: FieldPlan, inner: IdPlan, pos: int) -> int:
        count, pos = self.skip.array_length(pos, field)
        if field.kind is not STRUCT and field.kind is not STRUCT_ARRAY:
            raise MalformedMessage(f"{field.name} is not a struct")
        for _ in range(count):
            pos = self.struct(inner, pos)
        return pos

    def id_field(self, field: FieldPlan, pos: int, group: bool) -> int:
        if field.kind is VARIABLE:
            return self.one_id(field, pos, group)
        if field.kind is not VARIABLE_ARRAY:
            raise MalformedMessage(f"{field.name} is not a string")
        count, pos = self.skip.array_length(pos, field)
        for _ in range(count):
            pos = self.one_id(field, pos, group)
        return pos

    def one_id(self, field: FieldPlan, pos: int, group: bool) -> int:
        start = pos
        name, pos = wire.read_string(self.buf, pos, field.compact)
        if name is None:
            return pos
        if group and self.groups is not None and len(self.groups) < GROUPS_NOTED:
            self.groups.add(name)
        changed = self.change(name)
        if changed is not None and changed != name:
            self.edits.append((start, pos, wire.write_string(changed, field.compact)))
        return pos


__all__ = [
    "IdPlan",
    "Isolation",
    "check_suffix",
    "id_plan",
    "isolate_produce_head",
    "isolate_request",
    "isolating_caps",
    "request_ids",
    "response_ids",
    "restore_response",
]
