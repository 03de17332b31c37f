"""What each call says that routing verification needs, as small events.

LOOKUP: a FindCoordinator answer (key, the node and address it names, error); or, for a
partition, the leader a Metadata answer names.
CALL: a coordinator-scoped request and its answer's error, per group or transactional id;
or a Produce, Fetch or ListOffsets answer's error, per partition. A call answered with an
authorization error is none: a broker's authorizer answers so before any coordinator is
asked, and a tunnel that refuses it (`up --read-only`) answers in the broker's place, so it
says nothing of where the request went.
BROKERS / LEADERS: which node has which address; who leads the internal topics' partitions.
MISDIRECTED: a connection meant for a node reached another broker, which said so (an
ApiVersions answered REBOOTSTRAP_REQUIRED, KIP-1242).
NAMED: an address a client-facing answer named (for the leak check).
Bodies are decoded with kio (generated from Kafka's JSON schemas); addresses are found by
the same byte walk the rewriter uses.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import fields, is_dataclass
from typing import Any, NamedTuple

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader

from kafkatunnel.protocol import (
    ProtocolError,
    addresses_in,
    misdirected_to,
    parse_request_header,
    response_body_offset,
    top_level_error,
)
from kafkatunnel.verify.calls import ADDRESS_APIS, COORDINATOR_APIS, Call, Conn
from kafkatunnel.verify.partitions import (
    FETCH,
    LEADER_APIS,
    METADATA,
    NOT_LEADER_OR_FOLLOWER,
    PartitionAnswer,
    fetch_rack,
    partition_answers,
    partition_key,
)

LOOKUP, CALL, BROKERS, LEADERS, NAMED = "lookup", "call", "brokers", "leaders", "named"
MISDIRECTED = "misdirected"
GROUP, TRANSACTION, PARTITION = 0, 1, 2  # what an event's key is
INTERNAL_TOPICS = {"__consumer_offsets": GROUP, "__transaction_state": TRANSACTION}
# TOPIC_, GROUP_, CLUSTER_, TRANSACTIONAL_ID_ and DELEGATION_TOKEN_AUTHORIZATION_FAILED
AUTHORIZATION_FAILED = frozenset({29, 30, 31, 53, 65})
JOIN_GROUP, SYNC_GROUP, CONSUMER_GROUP_HEARTBEAT, API_VERSIONS = 11, 14, 68, 18
SHARE_GROUP_HEARTBEAT, STREAMS_GROUP_HEARTBEAT = 76, 88
# The heartbeats of the groups KIP-848 brought: the coordinator answers each with the
# member's epoch.
EPOCH_HEARTBEATS = {CONSUMER_GROUP_HEARTBEAT, SHARE_GROUP_HEARTBEAT, STREAMS_GROUP_HEARTBEAT}


class Event(NamedTuple):
    """A named tuple: Spark pickles hundreds of thousands of these."""

    kind: str
    ts: int
    conn: Conn
    api_key: int
    key: str | None = None  # group id, transactional id, or topic:partition
    key_type: int = GROUP
    error: int | None = None  # None: never answered in the recording
    node: int | None = None  # LOOKUP: the coordinator named; NAMED: the node named
    address: str | None = None  # LOOKUP / NAMED: the address named
    brokers: tuple[tuple[int, str], ...] = ()
    leaders: tuple[tuple[int, int, int], ...] = ()  # (key type, partition, leader)
    detail: dict[str, Any] | None = None
    client_id: str | None = None  # LOOKUP / MISDIRECTED: the asking client's client.id


_request_schema = functools.cache(load_request_schema)
_response_schema = functools.cache(load_response_schema)


def _decode(entity: type, frame: bytes, offset: int) -> Any:
    value: Any
    value, _end = entity_reader(entity)(frame, offset)
    return value


def _client_id(call: Call) -> str | None:
    """The client.id in the call's request header (None when it has none or is unreadable):
    a client's look-ups and its connections carry the same one."""
    assert call.request is not None
    try:
        return parse_request_header(call.request).client_id
    except ProtocolError:
        return None


def _request(call: Call) -> Any:
    assert call.request is not None
    header = parse_request_header(call.request)
    if header.body_offset is None:
        raise ProtocolError(f"API {call.api_key} v{call.api_version} is unknown")
    schema = _request_schema(call.api_key, call.api_version)
    return _decode(schema, call.request, header.body_offset)


def _response(call: Call) -> Any:
    assert call.response is not None
    offset = response_body_offset(call.response, call.api_key, call.api_version)
    schema = _response_schema(call.api_key, call.api_version)
    return _decode(schema, call.response, offset)


def first_error(value: Any) -> int:
    """The first non-zero error code anywhere in a decoded message (0 if none)."""
    if isinstance(value, tuple):
        for item in value:
            found = first_error(item)
            if found:
                return found
        return 0
    kind: type[object] = type(value)
    names = _field_names(kind)
    if not names:
        return 0
    code = getattr(value, "error_code", None)
    if code is not None and int(code):
        return int(code)
    for name in names:
        found = first_error(getattr(value, name))
        if found:
            return found
    return 0


_FIELD_NAMES: dict[type[object], tuple[str, ...]] = {}


def _field_names(kind: type[object]) -> tuple[str, ...]:
    """A kio message class's fields, which may hold errors (other values: none), kept."""
    names = _FIELD_NAMES.get(kind)
    if names is None:
        found = fields(kind) if is_dataclass(kind) else ()
        names = _FIELD_NAMES[kind] = tuple(f.name for f in found)
    return names


def _batched(items: Any, key_field: str) -> list[tuple[str, int]]:
    return [(str(getattr(item, key_field)), first_error(item)) for item in items]


def _keys(
    call: Call, request: Any, response: Any, fallback: int | None
) -> list[tuple[str, int, int | None]]:
    """(key, key type, error) for each group or transactional id a coordinator call is about.
    `fallback`: the error of an answer that could not be decoded whole."""
    api, version = call.api_key, call.api_version
    answered = response is not None
    if not answered and fallback is not None:
        return [(key, key_type, fallback) for key, key_type, _ in _keys(call, request, None, None)]
    batched: list[tuple[str, int]] | None = None
    if api == 9 and version >= 8:
        if answered:
            batched = _batched(response.groups, "group_id")
        else:
            return [(str(g.group_id), GROUP, None) for g in request.groups]
    elif api in (15, 69, 77, 89):  # DescribeGroups and each kind's own describe
        if answered:
            batched = _batched(response.groups, "group_id")
        else:
            ids = request.groups if api == 15 else request.group_ids
            return [(str(g), GROUP, None) for g in ids]
    elif api == 90:  # DescribeShareGroupOffsets
        if answered:
            batched = _batched(response.groups, "group_id")
        else:
            return [(str(g.group_id), GROUP, None) for g in request.groups]
    elif api == 42:
        if answered:
            batched = _batched(response.results, "group_id")
        else:
            return [(str(g), GROUP, None) for g in request.groups_names]
    elif api == 65:
        if answered:
            batched = _batched(response.transaction_states, "transactional_id")
        else:
            return [(str(t), TRANSACTION, None) for t in request.transactional_ids]
    elif api == 24 and version >= 4:
        if answered:
            batched = _batched(response.results_by_transaction, "transactional_id")
        else:
            return [(str(t.transactional_id), TRANSACTION, None) for t in request.transactions]
    if batched is not None:
        key_type = TRANSACTION if api in (24, 65) else GROUP
        return [(key, key_type, error) for key, error in batched]
    if api == 22:
        key, key_type = request.transactional_id, TRANSACTION
        if key is None:
            return []  # an idempotent producer's id: any broker may answer
    elif api == 24:
        key, key_type = request.v3_and_below_transactional_id, TRANSACTION
    elif api in (25, 26):
        key, key_type = request.transactional_id, TRANSACTION
    else:
        key, key_type = request.group_id, GROUP
    return [(str(key), key_type, first_error(response) if answered else None)]


@functools.cache
def _assignment_schema(version: int) -> type:
    module = importlib.import_module(f"kio.schema.consumer_protocol_assignment.v{version}.data")
    schema: type = module.ConsumerProtocolAssignment
    return schema


def _assignment(data: bytes | None) -> list[tuple[str, int]] | None:
    """A consumer-protocol assignment's partitions, or None when it is not one."""
    if not data or len(data) < 2:
        return [] if data is not None and len(data) == 0 else None
    version = int.from_bytes(data[:2], "big", signed=True)
    if version < 0:
        return None
    try:
        value = _decode(_assignment_schema(min(version, 3)), data, 2)
    except Exception:  # any bytes may sit here in a non-consumer protocol
        return None
    return [
        (str(topic.topic), int(p)) for topic in value.assigned_partitions for p in topic.partitions
    ]


def _membership(call: Call, request: Any, response: Any) -> dict[str, Any] | None:
    if call.api_key == JOIN_GROUP and response is not None:
        return {
            "member": str(response.member_id),
            "generation": int(response.generation_id),
            "offered": [str(p.name) for p in request.protocols],
            "chosen": None if response.protocol_name is None else str(response.protocol_name),
            "protocol_type": str(request.protocol_type),
            "leader": str(response.leader),
        }
    if call.api_key == SYNC_GROUP:
        detail: dict[str, Any] = {
            "member": str(request.member_id),
            "generation": int(request.generation_id),
            "assignments": {
                str(a.member_id): _assignment(bytes(a.assignment)) for a in request.assignments
            },
        }
        if response is not None:
            detail["assignment"] = _assignment(bytes(response.assignment))
        return detail
    if call.api_key in EPOCH_HEARTBEATS and response is not None:
        # Since KIP-1082 the client makes its member id and the answer may leave it out.
        member = response.member_id or request.member_id
        return {"member": str(member), "sent": int(request.member_epoch),
                "epoch": int(response.member_epoch)}  # fmt: skip
    return None


def _lookups(call: Call, request: Any, response: Any) -> list[Event]:
    ts = call.response_ts or call.request_ts
    if call.api_version >= 4:
        key_type = int(request.key_type)
        answers = [
            (str(c.key), int(c.error_code), int(c.node_id), f"{c.host}:{c.port}")
            for c in response.coordinators
        ]
    else:
        key_type = int(getattr(request, "key_type", GROUP))
        answers = [
            (
                str(request.key),
                int(response.error_code),
                int(response.node_id),
                f"{response.host}:{response.port}",
            )
        ]
    if key_type not in (GROUP, TRANSACTION):
        return []  # a share-state partition's coordinator (KIP-932): brokers ask, not clients
    client_id = _client_id(call)
    return [
        Event(LOOKUP, ts, call.conn, 10, key, key_type, error, node, address, client_id=client_id)
        for key, error, node, address in answers
    ]


def _leaders(answers: list[PartitionAnswer]) -> tuple[tuple[int, int, int], ...]:
    found = []
    for answer in answers:
        key_type = INTERNAL_TOPICS.get(answer.topic or "")
        if key_type is not None and answer.leader is not None:
            found.append((key_type, answer.partition, answer.leader))
    return tuple(found)


def _answers(call: Call) -> list[PartitionAnswer]:
    assert call.response is not None
    body = response_body_offset(call.response, call.api_key, call.api_version)
    return partition_answers(call.response, call.api_key, call.api_version, body)


def _partition_keys(answer: PartitionAnswer) -> list[str]:
    """A partition's keys: by topic name and by topic id (Fetch v13+ names only the id)."""
    keys = [] if answer.topic is None else [partition_key(answer.topic, answer.partition)]
    if answer.topic_id is not None:
        keys.append(partition_key(answer.topic_id, answer.partition))
    return keys


def _led(call: Call, answers: list[PartitionAnswer], ts: int) -> list[Event]:
    """What a Metadata answer says of who leads each (non-internal) partition."""
    return [
        Event(LOOKUP, ts, call.conn, METADATA, key, PARTITION, 0, answer.leader)
        for answer in answers
        if answer.error == 0 and answer.leader is not None and answer.leader >= 0
        and answer.topic not in INTERNAL_TOPICS
        for key in _partition_keys(answer)
    ]  # fmt: skip


def _partition_calls(call: Call) -> list[Event]:
    """A leader-only answer's verdict on each partition: served (it leads it) or
    NOT_LEADER_OR_FOLLOWER (it does not); other errors say nothing of leadership."""
    if call.api_key == FETCH and call.request is not None:
        header = parse_request_header(call.request)
        if header.body_offset is not None and fetch_rack(
            call.request, call.api_version, header.body_offset
        ):
            return []  # a rack-aware consumer may be fetching from a follower
    return [
        Event(CALL, call.request_ts, call.conn, call.api_key, key, PARTITION, answer.error)
        for answer in _answers(call)
        if answer.error in (0, NOT_LEADER_OR_FOLLOWER)
        for key in _partition_keys(answer)[:1]
    ]


def events_of(call: Call) -> list[Event]:
    """The events of one call. Raises (ProtocolError, or kio's errors) when a message cannot
    be decoded; the caller counts that as a problem of the recording."""
    out: list[Event] = []
    response_ts = call.response_ts or call.request_ts
    if call.response is not None and call.api_key in ADDRESS_APIS:
        seen = addresses_in(call.response, call.api_key, call.api_version)
        for address in seen:
            where = f"{address.host}:{address.port}"
            out.append(Event(NAMED, response_ts, call.conn, call.api_key, node=address.node_id,
                             address=where))  # fmt: skip
        if call.api_key in (3, 60) and seen:
            brokers = tuple((a.node_id, f"{a.host}:{a.port}") for a in seen)
            out.append(Event(BROKERS, response_ts, call.conn, call.api_key, brokers=brokers))
    # Who leads which partition identifies the brokers behind a plain capture's addresses;
    # a kafkatunnel recording's listeners name theirs, so it needs only the internal topics'.
    plain = not call.conn.tunnel
    response = call.response
    if call.api_key == METADATA and response is not None:
        if plain or any(name.encode() in response for name in INTERNAL_TOPICS):
            answers = _answers(call)
            leaders = _leaders(answers)
            if leaders:
                out.append(Event(LEADERS, response_ts, call.conn, METADATA, leaders=leaders))
            if plain:
                out.extend(_led(call, answers, response_ts))
    elif call.api_key in LEADER_APIS and response is not None and plain:
        out.extend(_partition_calls(call))
    if call.request is None:
        return out
    if call.api_key == API_VERSIONS and call.response is not None:
        meant = misdirected_to(call.request, call.response)
        if meant is not None:
            out.append(Event(MISDIRECTED, response_ts, call.conn, API_VERSIONS, node=meant,
                             client_id=_client_id(call)))  # fmt: skip
    elif call.api_key == 10 and call.response is not None:
        out.extend(_lookups(call, _request(call), _response(call)))
    elif call.api_key in COORDINATOR_APIS:
        request = _request(call)
        response = fallback = None
        if call.response is not None:
            try:
                response = _response(call)
            except Exception:
                fallback = top_level_error(call.response, call.api_key, call.api_version)
                if fallback is None:
                    raise
        detail = _membership(call, request, response)
        for key, key_type, error in _keys(call, request, response, fallback):
            if error in AUTHORIZATION_FAILED:
                continue  # refused before any coordinator was asked (see above)
            out.append(Event(CALL, call.request_ts, call.conn, call.api_key, key, key_type,
                             error, detail=detail))  # fmt: skip
    return out
