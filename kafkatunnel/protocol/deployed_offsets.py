"""Where an isolated consumer starts (`up --isolate --isolate-from-deployed`): at the
deployed group's committed offsets, read and never changed.

An isolated group has no committed offsets on its first run. With --isolate-from-deployed,
a client's OffsetFetch is preceded by one for each group it names, as the client named it
(the deployed group), asked by the tunnel of that group's own coordinator
(`deployed_requests`); where the isolated group's answer then has no committed offset for
a partition, the client is told the deployed group's (`seeded_answer`). Its first commit
makes them its own. Nothing is written to the deployed group: an OffsetFetch only reads,
and it is sent as an admin's (no member id, member epoch -1), so that it never counts as
a member's.

Sans-I/O: frames in, frames out, by kio's schemas (an OffsetFetch exchange is small and
rare: at a consumer's start and after a rebalance). Partitions are keyed by topic name,
or from v10 on by topic id, as the client's own request names them, so the deployed
answer and the isolated one key alike.
"""

from __future__ import annotations

import dataclasses
import io
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from kafkatunnel.protocol.errors import MalformedMessage
from kafkatunnel.protocol.framing import SIZE_PREFIX, frame
from kafkatunnel.protocol.headers import RequestHeader, response_body_offset

OFFSET_FETCH = 9
BATCHED = 8  # from v8 on, a request names groups, each with its topics
NO_OFFSET = -1
ADMIN_EPOCH = -1  # a member epoch that names no member: an admin's fetch

TopicKey = str | uuid.UUID  # a topic's name, or (v10 on) its id


class Committed(NamedTuple):
    """A deployed group's committed offset of one partition, as OffsetFetch tells it."""

    offset: int
    leader_epoch: int
    metadata: str | None


# group (as the client names it) -> (topic, partition) -> what the deployed group committed
Seeds = Mapping[str, Mapping[tuple[TopicKey, int], Committed]]


def deployed_requests(whole: bytes, header: RequestHeader) -> dict[str, bytes]:
    """For a client's OffsetFetch request (the frame as the client sent it), one request
    per group it names asking the deployed group of that name for the same partitions, at
    the same version, with the client's header: group -> request frame."""
    body = _body_offset(header)
    request = _read(load_request_schema(OFFSET_FETCH, header.api_version), whole, body)
    head = whole[SIZE_PREFIX:body]
    if header.api_version < BATCHED:
        return {str(request.group_id): whole}
    asks = {}
    for group in request.groups:
        alone = dataclasses.replace(request, groups=(_as_admin(group),))
        asks[str(group.group_id)] = frame(head + _written(alone))
    return asks


def deployed_offsets(answer: bytes, api_version: int) -> dict[tuple[TopicKey, int], Committed]:
    """What a deployed group's OffsetFetch answer (for one group, as deployed_requests
    asked) says it committed: the partitions with an offset and no error."""
    response = _read_response(answer, api_version)
    topics = response.topics if api_version < BATCHED else _one_group(response).topics
    if api_version >= 2 and api_version < BATCHED and response.error_code != ErrorCode.none:
        return {}
    if api_version >= BATCHED and _one_group(response).error_code != ErrorCode.none:
        return {}
    return {
        (_topic_key(topic), int(p.partition_index)): Committed(
            int(p.committed_offset), int(getattr(p, "committed_leader_epoch", -1)), p.metadata
        )
        for topic in topics
        for p in topic.partitions
        if p.error_code == ErrorCode.none and p.committed_offset != NO_OFFSET
    }


def seeded_answer(answer: bytes, api_version: int, group: str | None, seeds: Seeds) -> bytes:
    """The isolated groups' OffsetFetch answer (their ids already as the client names
    them) with each partition that has no committed offset told the deployed group's, where
    it has one; the same object when nothing changed. `group`: the one group of a request
    before v8 (its answer does not name it)."""
    response = _read_response(answer, api_version)
    if api_version < BATCHED:
        seeded = _seeded_topics(response.topics, seeds.get(group or "", {}))
        if seeded is None:
            return answer
        changed = dataclasses.replace(response, topics=seeded)
    else:
        groups = []
        for each in response.groups:
            topics = _seeded_topics(each.topics, seeds.get(str(each.group_id), {}))
            groups.append(each if topics is None else dataclasses.replace(each, topics=topics))
        if all(a is b for a, b in zip(groups, response.groups, strict=True)):
            return answer
        changed = dataclasses.replace(response, groups=tuple(groups))
    head = answer[SIZE_PREFIX : response_body_offset(answer, OFFSET_FETCH, api_version)]
    return frame(head + _written(changed))


def _seeded_topics(
    topics: tuple[Any, ...], seeds: Mapping[tuple[TopicKey, int], Committed]
) -> tuple[Any, ...] | None:
    if not seeds:
        return None
    out, changed = [], False
    for topic in topics:
        partitions = []
        for p in topic.partitions:
            seed = seeds.get((_topic_key(topic), int(p.partition_index)))
            if seed is None or p.committed_offset != NO_OFFSET or p.error_code != ErrorCode.none:
                partitions.append(p)
                continue
            fields: dict[str, Any] = {"committed_offset": type(p.committed_offset)(seed.offset),
                                      "metadata": seed.metadata}  # fmt: skip
            if hasattr(p, "committed_leader_epoch"):
                fields["committed_leader_epoch"] = type(p.committed_leader_epoch)(seed.leader_epoch)
            partitions.append(dataclasses.replace(p, **fields))
            changed = True
        out.append(dataclasses.replace(topic, partitions=tuple(partitions)))
    return tuple(out) if changed else None


def _as_admin(group: Any) -> Any:
    """A request's group asked as an admin asks it: no member id, no member epoch."""
    if not hasattr(group, "member_epoch"):  # before v9: no member named at all
        return group
    return dataclasses.replace(group, member_id=None, member_epoch=type(group.member_epoch)(-1))


def _topic_key(topic: Any) -> TopicKey:
    return topic.topic_id if hasattr(topic, "topic_id") else str(topic.name)


def _one_group(response: Any) -> Any:
    if len(response.groups) != 1:
        raise MalformedMessage(f"an answer for one group names {len(response.groups)}")
    return response.groups[0]


def _body_offset(header: RequestHeader) -> int:
    if header.api_key != OFFSET_FETCH or header.body_offset is None:
        raise MalformedMessage(f"API {header.api_key} v{header.api_version} is no OffsetFetch")
    return header.body_offset


def _read(entity: Any, whole: bytes, body: int) -> Any:
    try:
        value, _ = entity_reader(entity)(whole[body:], 0)
    except Exception as error:  # kio's own errors: a message nobody can read
        raise MalformedMessage(f"{entity.__name__}: {error}") from None
    return value


def _read_response(answer: bytes, api_version: int) -> Any:
    body = response_body_offset(answer, OFFSET_FETCH, api_version)
    return _read(load_response_schema(OFFSET_FETCH, api_version), answer, body)


def _written(entity: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


__all__ = [
    "OFFSET_FETCH",
    "Committed",
    "Seeds",
    "deployed_offsets",
    "deployed_requests",
    "seeded_answer",
]
