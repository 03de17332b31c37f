"""Walk plans for Kafka messages, derived from kio's dataclasses (which kio generates from
Kafka's own JSON message definitions), so no field layout is written by hand here.

A plan says, per field, how to skip it and whether a broker address can be inside. The
rewriter walks bytes with a plan instead of decoding into objects: it touches only what it
must, and stops as soon as no address can follow.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.static.constants import EntityType

from kafkatunnel.protocol.errors import UnknownApiKey, UnsupportedVersion

FIXED_SIZES = {
    "int8": 1, "bool": 1, "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "timedelta_i64": 8, "datetime_i64": 8,
    "uuid": 16,
}  # fmt: skip
VARIABLE_TYPES = {"string", "bytes", "records"}


class Kind(Enum):
    FIXED = "fixed"  # a fixed-size primitive
    VARIABLE = "variable"  # a string, bytes or records
    FIXED_ARRAY = "fixed_array"
    VARIABLE_ARRAY = "variable_array"
    STRUCT = "struct"
    STRUCT_ARRAY = "struct_array"


# The members under plain names: a member looked up on its Enum class costs a descriptor
# call (about 50 ns), and the walks compare a field's kind for every field they read.
FIXED = Kind.FIXED
VARIABLE = Kind.VARIABLE
FIXED_ARRAY = Kind.FIXED_ARRAY
VARIABLE_ARRAY = Kind.VARIABLE_ARRAY
STRUCT = Kind.STRUCT
STRUCT_ARRAY = Kind.STRUCT_ARRAY


@dataclass(frozen=True, slots=True)
class FieldPlan:
    name: str
    kind: Kind
    kafka_type: str
    size: int  # bytes of one fixed-size value, else 0
    nullable: bool
    compact: bool  # compact lengths (uvarint + 1), as in flexible versions
    struct: StructPlan | None


@dataclass(frozen=True, slots=True)
class AddressSlots:
    """Where a broker address sits in a struct: indexes into its fields."""

    host: int
    port: int


@dataclass(frozen=True, slots=True)
class StructPlan:
    name: str
    flexible: bool
    fields: tuple[FieldPlan, ...]
    tagged: dict[int, FieldPlan]
    address: AddressSlots | None
    node_field: int | None  # index of node_id/broker_id: the node of addresses at or below
    has_addresses: bool  # an address in this struct or anywhere below it
    addresses_until: int  # fields[addresses_until:] hold no address
    tagged_addresses: bool  # some tagged field may hold an address
    # The fields as walking steps: runs of fixed-size fields merged into one byte count.
    steps: tuple[int | FieldPlan, ...] = ()


def _without_none(hint: Any) -> tuple[Any, bool]:
    """`X | None` -> (X, True); any other type hint -> (it, False)."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        args = typing.get_args(hint)
        if type(None) in args:
            rest = [a for a in args if a is not type(None)]
            if len(rest) == 1:
                return rest[0], True
    return hint, False


def _shape(field: dataclasses.Field[Any]) -> tuple[type | None, bool, bool]:
    """How kio types a field: the entity class inside it (None: a primitive), whether it is
    an array (`tuple[X, ...]`), and whether it is nullable (the array, or its item)."""
    hint, nullable = _without_none(field.type)
    array = typing.get_origin(hint) is tuple
    if array:
        hint, item_nullable = _without_none(typing.get_args(hint)[0])
        nullable = nullable or item_nullable
    entity = hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None
    return entity, array, nullable


def _field_plan(field: dataclasses.Field[Any], flexible: bool, tagged: bool) -> FieldPlan:
    entity, array, optional = _shape(field)
    # A tagged field's presence is its nullability; its value is encoded as non-null.
    nullable = False if tagged else optional
    if entity is not None:
        sub = struct_plan(entity)
        kind = Kind.STRUCT_ARRAY if array else Kind.STRUCT
        return FieldPlan(field.name, kind, "struct", 0, nullable, flexible, sub)
    kafka_type = str(field.metadata["kafka_type"])  # kio's name of the field's Kafka type
    if kafka_type in FIXED_SIZES:
        kind = Kind.FIXED_ARRAY if array else Kind.FIXED
        size = FIXED_SIZES[kafka_type]
        return FieldPlan(field.name, kind, kafka_type, size, nullable, flexible, None)
    if kafka_type in VARIABLE_TYPES:
        kind = Kind.VARIABLE_ARRAY if array else Kind.VARIABLE
        return FieldPlan(field.name, kind, kafka_type, 0, nullable, flexible, None)
    raise NotImplementedError(f"kafka type {kafka_type!r} of field {field.name!r}")


def _holds_address(plan: FieldPlan) -> bool:
    return plan.struct is not None and plan.struct.has_addresses


@functools.cache
def struct_plan(entity: type) -> StructPlan:
    """The plan for one kio entity class (cached: plans are immutable)."""
    flexible = bool(entity.__flexible__)  # type: ignore[attr-defined]
    fields: list[FieldPlan] = []
    tagged: dict[int, FieldPlan] = {}
    for field in dataclasses.fields(entity):
        tag = field.metadata.get("tag")
        plan = _field_plan(field, flexible, tag is not None)
        if tag is None:
            fields.append(plan)
        else:
            tagged[int(tag)] = plan
    names = [f.name for f in fields]
    address = None
    if "host" in names and "port" in names:
        address = AddressSlots(names.index("host"), names.index("port"))
    node_field = next(
        (i for i, f in enumerate(fields) if f.name in ("node_id", "broker_id") and f.size == 4),
        None,
    )
    until = 0
    for index, plan in enumerate(fields):
        if _holds_address(plan):
            until = index + 1
    if address is not None:
        until = max(until, address.host + 1, address.port + 1)
    tagged_addresses = any(_holds_address(p) for p in tagged.values())
    steps: list[int | FieldPlan] = []
    for plan in fields:
        if plan.kind is Kind.FIXED:
            if steps and isinstance(steps[-1], int):
                steps[-1] += plan.size
            else:
                steps.append(plan.size)
        else:
            steps.append(plan)
    return StructPlan(
        name=entity.__name__,
        flexible=flexible,
        fields=tuple(fields),
        tagged=tagged,
        address=address,
        node_field=node_field,
        has_addresses=address is not None or until > 0 or tagged_addresses,
        addresses_until=until,
        tagged_addresses=tagged_addresses,
        steps=tuple(steps),
    )


def api_name(api_key: int) -> str:
    try:
        return api_key_map[api_key]
    except KeyError:
        raise UnknownApiKey(f"API key {api_key} is not a Kafka API this tunnel knows") from None


def api_title(api_key: int) -> str:
    """The API's name as Kafka spells it: FindCoordinator, not find_coordinator."""
    return "".join(part.capitalize() for part in api_name(api_key).split("_"))


@functools.cache
def known_versions(api_key: int) -> range:
    versions = sorted(schema_name_map[api_name(api_key)])
    return range(versions[0], versions[-1] + 1)


@functools.cache
def response_plan(api_key: int, version: int) -> StructPlan:
    """The plan for a response body; raises UnknownApiKey / UnsupportedVersion."""
    name = api_name(api_key)
    if version not in schema_name_map[name]:
        raise _unsupported(api_key, name, version)
    return struct_plan(load_response_schema(api_key, version))


def _unsupported(api_key: int, name: str, version: int) -> UnsupportedVersion:
    span = known_versions(api_key)
    older = " (Kafka 4 dropped versions this old: KIP-896)" if version < span.start else ""
    return UnsupportedVersion(
        f"{name} v{version}{older} is outside the versions kafkatunnel can parse "
        f"(v{span.start} to v{span.stop - 1})"
    )


@functools.cache
def request_plan(api_key: int, version: int) -> StructPlan:
    """The plan for a request body; raises UnknownApiKey / UnsupportedVersion."""
    name = api_name(api_key)
    if version not in schema_name_map[name]:
        raise _unsupported(api_key, name, version)
    return struct_plan(load_request_schema(api_key, version))


@functools.cache
def is_flexible(api_key: int, version: int, entity: EntityType = EntityType.request) -> bool:
    """Whether this version of the API uses compact encodings and tagged fields."""
    name = api_name(api_key)
    if version not in schema_name_map[name]:
        raise _unsupported(api_key, name, version)
    loader = load_request_schema if entity is EntityType.request else load_response_schema
    return bool(loader(api_key, version).__flexible__)
