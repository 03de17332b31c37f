"""Requests of any API and version kio knows, built from kio's schemas with a value in every
field (two items in every list), so that a test sees each answer's lists filled."""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
import uuid
from typing import Any

from kio.index import load_request_schema

NOW = datetime.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=datetime.UTC)


def built(api_key: int, version: int, **given: Any) -> Any:
    """A request of this API and version, `given` fields as said, the rest filled."""
    request_type: Any = load_request_schema(api_key, version)
    return dataclasses.replace(_entity(request_type, 0), **given)


def _entity(entity: Any, index: int) -> Any:
    hints = typing.get_type_hints(entity)
    values = {}
    for field in dataclasses.fields(entity):
        values[field.name] = _value(hints[field.name], field, index)
    return entity(**values)


def _value(hint: Any, field: dataclasses.Field[Any], index: int) -> Any:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    kind = field.metadata.get("kafka_type")
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        if dataclasses.is_dataclass(item):
            return tuple(_entity(item, i) for i in range(2))
        return tuple(_scalar(kind, field.name, i) for i in range(2))
    if dataclasses.is_dataclass(hint):
        return _entity(hint, index)
    return _scalar(kind, field.name, index)


def _scalar(kind: str | None, name: str, index: int) -> Any:
    if name == "resource_type":
        return (2, 4)[index % 2]  # a topic, a broker: answered with different errors
    if kind in ("string", None):
        return f"{name}-{index}"
    if kind == "bool":
        return False
    if kind in ("int8", "int16", "int32", "int64", "uint16", "uint32", "uint64"):
        return index + 1
    if kind == "float64":
        return 1.5
    if kind == "uuid":
        return uuid.UUID(int=index + 1)
    if kind == "bytes":
        return b"bytes"
    if kind == "records":
        return b"\x00" * 16
    if kind.startswith("timedelta"):
        return datetime.timedelta(seconds=30)
    if kind.startswith("datetime"):
        return NOW
    if kind == "error_code":
        return 0
    raise AssertionError(f"no value for {kind} {name}")


def error_fields(value: Any) -> list[tuple[str, Any, Any]]:
    """(field, value, the struct holding it) for every error code and error message in an
    answer `value` of kio's, tagged fields left out (their defaults say nothing)."""
    found: list[tuple[str, Any, Any]] = []
    for field in dataclasses.fields(value):
        inner = getattr(value, field.name)
        if "tag" in field.metadata:
            continue
        if field.metadata.get("kafka_type") == "error_code" or field.name.endswith("error_message"):
            found.append((field.name, inner, value))
        elif isinstance(inner, tuple):
            for item in inner:
                if dataclasses.is_dataclass(item):
                    found.extend(error_fields(item))
        elif dataclasses.is_dataclass(inner):
            found.extend(error_fields(inner))
    return found
