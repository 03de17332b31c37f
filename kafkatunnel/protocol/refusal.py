"""The answer to a refused request: what Kafka itself answers a client that is not
authorized, so clients fail with their ordinary authorization error, not a lost connection.

Built from the request by kio's generated schemas (no field layout is written here): every
error code of the answer is the API's authorization error (TOPIC_AUTHORIZATION_FAILED per
topic and partition for Produce, GROUP_AUTHORIZATION_FAILED for a group's offsets...),
every error message says why, and the answer names what the request named (its topics,
partitions, groups, resources) wherever the answer has a field of the same name, as a
broker's does, so a client can match each result to what it asked.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import types
import typing
import uuid
from typing import Any, NamedTuple

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from kafkatunnel.protocol.framing import frame
from kafkatunnel.protocol.headers import RequestHeader, response_head
from kafkatunnel.protocol.own_login import LOGIN_APIS, own_login_answer
from kafkatunnel.protocol.policy import Policy, read_request

TOPIC = ErrorCode.topic_authorization_failed
GROUP = ErrorCode.group_authorization_failed
CLUSTER = ErrorCode.cluster_authorization_failed
TRANSACTION = ErrorCode.transactional_id_authorization_failed
TOKEN = ErrorCode.delegation_token_authorization_failed
# Each API's authorization error, as Kafka's broker answers it; any other: CLUSTER.
AUTHORIZATION_ERRORS: dict[int, ErrorCode] = {
    **dict.fromkeys((0, 1, 2, 3, 19, 20, 21, 23, 37, 61, 75, 78, 79), TOPIC),
    **dict.fromkeys((8, 9, 10, 11, 12, 13, 14, 15, 42, 47, 68, 69, 76, 77, 88, 89, 90), GROUP),
    **dict.fromkeys((91, 92), GROUP),
    **dict.fromkeys((22, 24, 25, 26, 28, 65), TRANSACTION),
    **dict.fromkeys((38, 39, 40, 41), TOKEN),
}
# Configs are authorized per resource: by its type (Kafka's ConfigResource.Type).
CONFIG_APIS = frozenset({32, 33, 44})
RESOURCE_ERRORS = {2: TOPIC, 32: GROUP}  # TOPIC, GROUP; BROKER, BROKER_LOGGER...: CLUSTER
# An answer's field named differently from the request's field it repeats.
RENAMED = {"topic_name": "name", "user": "name"}
# An answer's list made of several of the request's, or of a list within a list.
GATHERED = {
    "AlterReplicaLogDirsResponse.results": lambda r: [t for d in r.dirs for t in d.topics],
    "AlterUserScramCredentialsResponse.results": lambda r: [*r.deletions, *r.upsertions],
}
EPOCH = datetime.datetime.fromtimestamp(0, datetime.UTC)


class Fill(NamedTuple):
    error: ErrorCode
    message: str
    api_key: int

    def error_for(self, source: Any) -> ErrorCode:
        if self.api_key in CONFIG_APIS:
            kind = getattr(source, "resource_type", None)
            return RESOURCE_ERRORS.get(int(kind), CLUSTER) if kind is not None else CLUSTER
        return self.error


def authorization_error(api_key: int) -> ErrorCode:
    return AUTHORIZATION_ERRORS.get(api_key, CLUSTER)


def refused_answer(policy: Policy, request_frame: bytes, header: RequestHeader) -> bytes:
    """The whole response frame to a request `policy` refuses: the client's own login when
    the tunnel logs in (own_login), any other as Kafka refuses an unauthorized client."""
    if policy.login is not None and header.api_key in LOGIN_APIS:
        return own_login_answer(header, policy.login)
    return refusal(request_frame, header, policy.reason_for(header.api_key))


def refusal(request_frame: bytes, header: RequestHeader, reason: str) -> bytes:
    """The whole response frame refusing this request (a whole frame, size prefix included),
    with its correlation id. Raises (kio's errors, ProtocolError) for a request that cannot
    be read, or an API or version without a schema here."""
    request = read_request(header, request_frame)
    key, version = header.api_key, header.api_version
    response_type: Any = load_response_schema(key, version)
    fill = Fill(authorization_error(key), f"Authorization failed: {reason}", key)
    body = _answer(response_type, request, fill)
    out = io.BytesIO()
    out.write(response_head(header.correlation_id, key, version))
    entity_writer(response_type)(out, body)
    return frame(out.getvalue())


@functools.cache
def _hints(entity: type) -> dict[str, Any]:
    return typing.get_type_hints(entity)


def _parts(hint: Any) -> tuple[Any, bool]:
    """A field's type without None, and whether None is allowed."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        return rest[0], True
    return hint, False


def _answer(entity: type, source: Any, fill: Fill) -> Any:
    """An instance of `entity` (an answer or a struct in it) for `source` (the request, the
    request's struct it answers, a name or number from a list of them, or None)."""
    values: dict[str, Any] = {}
    hints = _hints(entity)
    plain = source is not None and not dataclasses.is_dataclass(source)  # a name, a number
    for field in dataclasses.fields(entity):
        if "tag" in field.metadata and field.default is not dataclasses.MISSING:
            continue  # tagged fields: their defaults say nothing
        name, kind = field.name, field.metadata.get("kafka_type")
        hint, nullable = _parts(hints[name])
        if kind == "error_code":
            values[name] = fill.error_for(source)
        elif name.endswith("error_message"):
            values[name] = fill.message
        elif name == "throttle_time":
            values[name] = datetime.timedelta(0)
        elif typing.get_origin(hint) is tuple:
            item = typing.get_args(hint)[0]
            if not dataclasses.is_dataclass(item):
                values[name] = tuple(getattr(source, name, None) or ())
            elif nullable:
                values[name] = None  # a broker fills these only on success
            else:
                items = _items(f"{entity.__name__}.{name}", name, source)
                values[name] = tuple(_answer(typing.cast(type, item), s, fill) for s in items)
        elif dataclasses.is_dataclass(hint):
            values[name] = _answer(typing.cast(type, hint), getattr(source, name, None), fill)
        elif plain and _fits(source, kind):
            values[name], plain = source, False  # the item a name or number stands for
        elif not plain and source is not None and hasattr(source, RENAMED.get(name, name)):
            values[name] = getattr(source, name if hasattr(source, name) else RENAMED[name])
        elif field.default is dataclasses.MISSING:
            values[name] = _nothing(kind, nullable)
    return entity(**values)


def _items(where: str, name: str, source: Any) -> list[Any]:
    """The request's items an answer's list answers, one each."""
    if source is None or not dataclasses.is_dataclass(source):
        return []
    gathered = GATHERED.get(where)
    if gathered is not None:
        return gathered(source)
    if hasattr(source, name):
        return list(getattr(source, name) or ())
    lists = [
        value
        for field in dataclasses.fields(source)
        if isinstance(value := getattr(source, field.name), tuple)
    ]
    return list(lists[0]) if len(lists) == 1 else []


def _fits(value: Any, kind: str | None) -> bool:
    if isinstance(value, str):
        return kind == "string"
    return isinstance(value, int) and kind in ("int8", "int16", "int32", "int64")


def _nothing(kind: str | None, nullable: bool) -> Any:
    """A field's value in a refusal when nothing says otherwise: -1 for numbers (no offset,
    no id, as Kafka answers), empty or null for the rest."""
    if nullable:
        return None
    if kind is None:
        return ()
    if kind.startswith("int"):
        return -1
    if kind.startswith("uint"):
        return 0
    if kind == "bool":
        return False
    if kind == "float64":
        return 0.0
    if kind == "string":
        return ""
    if kind in ("bytes", "records"):  # records: FetchSnapshot's unaligned_records
        return b""
    if kind == "uuid":
        return uuid.UUID(int=0)
    if kind.startswith("timedelta"):
        return datetime.timedelta(0)
    if kind.startswith("datetime"):
        return EPOCH
    return None
