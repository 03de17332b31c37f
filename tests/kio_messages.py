"""Independent encoding of Kafka messages for tests: kio, generated from Kafka's JSON schemas.

Also the reference form of a rewrite, computed on objects rather than bytes: every struct
with a host and a port gets the address the mapper gives its node.
"""

from __future__ import annotations

import dataclasses
import io
import random
import struct
from collections.abc import Callable
from typing import Any

import kio.schema.types
import kio.static.primitive
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer

from kafkatunnel.protocol import BrokerAddress, frame, response_header_version, wire


def _register_kio_strategies() -> None:
    for module in (kio.static.primitive, kio.schema.types):
        for value in vars(module).values():
            hook = getattr(value, "__hypothesis_hook__", None)
            if isinstance(value, type) and hook is not None:
                hook()

    # Record batches are opaque to the tunnel: any bytes will do.
    st.register_type_strategy(kio.static.primitive.Records, st.binary(max_size=64))


_register_kio_strategies()


def encode(entity: Any) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def decode(entity_type: type, data: bytes) -> Any:
    value: Any
    value, _size = entity_reader(entity_type)(data, 0)
    return value


def response_frame(api_key: int, version: int, body: bytes, correlation_id: int = 7) -> bytes:
    header = correlation_id.to_bytes(4, "big", signed=True)
    if response_header_version(api_key, version) == 1:
        header += b"\x00"  # no tagged fields in the header
    return frame(header + body)


def response_body(api_key: int, version: int, data: bytes) -> bytes:
    """The body of a response frame built by `response_frame` (or a rewrite of one)."""
    skip = 4 + 4 + (1 if response_header_version(api_key, version) == 1 else 0)
    return data[skip:]


def request_frame(entity: Any, correlation_id: int = 11, client_id: str | None = "tests") -> bytes:
    api_key, version = int(entity.__api_key__), int(entity.__version__)
    header_type = RequestHeaderV2 if entity.__flexible__ else RequestHeaderV1
    header = header_type(
        request_api_key=api_key,  # type: ignore[arg-type]
        request_api_version=version,  # type: ignore[arg-type]
        correlation_id=correlation_id,  # type: ignore[arg-type]
        client_id=client_id,
    )
    return frame(encode(header) + encode(entity))


def fetch_request(version: int, correlation_id: int, body_size: int = 20) -> bytes:
    """A flexible Fetch request: the Exchange reads only its header, so its body is any bytes."""
    header = RequestHeaderV2(
        request_api_key=1,  # type: ignore[arg-type]
        request_api_version=version,  # type: ignore[arg-type]
        correlation_id=correlation_id,  # type: ignore[arg-type]
        client_id="tests",
    )
    return frame(encode(header) + random.randbytes(body_size))


def responses(api_key: int, version: int) -> st.SearchStrategy[Any]:
    return st.from_type(load_response_schema(api_key, version))


def requests(api_key: int, version: int) -> st.SearchStrategy[Any]:
    return st.from_type(load_request_schema(api_key, version))


DESCEND: Any = object()  # from a replace_fields change: keep the field, look inside it


def replace_fields(value: Any, change: Callable[[dataclasses.Field[Any], Any], Any]) -> Any:
    """`value` (a kio message, an entity in it, or a tuple of them) with each field's value
    replaced by change(field, value); where change answers DESCEND, the field's own entities
    are looked into the same way."""
    if isinstance(value, tuple):
        return tuple(replace_fields(item, change) for item in value)
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return value
    changes = {}
    for field in dataclasses.fields(value):
        inner = getattr(value, field.name)
        new = change(field, inner)
        changes[field.name] = replace_fields(inner, change) if new is DESCEND else new
    return dataclasses.replace(value, **changes)


def _node_of(entity: Any, inherited: int | None) -> int | None:
    for name in ("node_id", "broker_id"):
        value = getattr(entity, name, None)
        if isinstance(value, int):
            return int(value)
    return inherited


def map_addresses(
    value: Any,
    mapper: Callable[[BrokerAddress], tuple[str, int] | None],
    seen: list[BrokerAddress],
    node: int | None = None,
) -> Any:
    """`value` with each host/port replaced as the mapper says, collecting what it saw."""
    if isinstance(value, tuple):
        return tuple(map_addresses(item, mapper, seen, node) for item in value)
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return value
    node = _node_of(value, node)
    changes: dict[str, Any] = {}
    names = {f.name for f in dataclasses.fields(value)}
    if {"host", "port"} <= names and node is not None and node >= 0 and value.host is not None:  # type: ignore[attr-defined]
        address = BrokerAddress(node, value.host, int(value.port))  # type: ignore[attr-defined]
        seen.append(address)
        target = mapper(address)
        if target is not None:
            changes["host"], changes["port"] = target[0], type(value.port)(target[1])  # type: ignore[attr-defined]
    for field in dataclasses.fields(value):
        if field.name in changes:
            continue
        inner = getattr(value, field.name)
        mapped = map_addresses(inner, mapper, seen, node)
        if mapped is not inner:
            changes[field.name] = mapped
    return dataclasses.replace(value, **changes) if changes else value


def api_versions_v5(node: int, cluster: str | None = "c1", correlation_id: int = 7) -> bytes:
    """An ApiVersions v5 request as Kafka 4.4's clients send it (ApiVersionsRequest.json,
    KIP-1242: it names the node meant), written by hand: kio's schemas end at v4."""
    body = wire.write_string("apache-kafka-java", True) + wire.write_string("4.4.0", True)
    body += b"\x00" if cluster is None else wire.write_string(cluster, True)
    body += wire.write_int32(node) + b"\x00"
    header = struct.pack(">hhi", 18, 5, correlation_id) + wire.write_string("consumer-g-1", False)
    return frame(header + b"\x00" + body)


def api_versions_answer(error: int, correlation_id: int = 7) -> bytes:
    """An ApiVersions answer with `error` and no APIs (REBOOTSTRAP_REQUIRED is 129)."""
    return frame(struct.pack(">ih", correlation_id, error) + b"\x01\x00\x00\x00\x00\x00")
