"""Which partitions an answer speaks for, and what it said of each, read by walking its bytes.

Partition leadership is the second kind of behaviour that names the broker behind an
address: Produce, Fetch and ListOffsets go to a partition's leader, and a broker that does
not lead it answers NOT_LEADER_OR_FOLLOWER; a Metadata answer says who leads what. These
answers are the bulk of a capture (Fetch answers carry the records), so they are walked by
the plans the rewriter uses, records skipped by their length, never decoded into objects.
"""

from __future__ import annotations

import uuid
from typing import NamedTuple

from kafkatunnel.protocol import (
    ByteWalk,
    StructPlan,
    keep_address,
    request_plan,
    response_plan,
    wire,
)

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
LEADER_APIS = (PRODUCE, FETCH, LIST_OFFSETS)  # answered by the partition's leader only
NOT_LEADER_OR_FOLLOWER = 6
_NO_TOPIC_ID = uuid.UUID(int=0)


class PartitionAnswer(NamedTuple):
    topic: str | None  # the topic's name, when the message carries it
    topic_id: str | None  # its id (Fetch v13+ carries only this; Metadata v10+ both)
    partition: int
    error: int
    leader: int | None  # Metadata: the partition's leader


def partition_key(topic: str, partition: int) -> str:
    """A partition's key in verify's events (topic names cannot hold a colon)."""
    return f"{topic}:{partition}"


class _Slots(NamedTuple):
    topic: int | None
    topic_id: int | None
    partition: int | None
    error: int | None
    leader: int | None


_SLOTS: dict[int, _Slots] = {}  # by id: plans are cached for good (and hold a dict)


def _slots(plan: StructPlan) -> _Slots:
    found = _SLOTS.get(id(plan))
    if found is None:
        found = _SLOTS[id(plan)] = _find_slots(plan)
    return found


def _find_slots(plan: StructPlan) -> _Slots:
    names = [f.name for f in plan.fields]

    def find(*candidates: str, size: int | None = None, kind: str | None = None) -> int | None:
        for index, field in enumerate(plan.fields):
            if (
                field.name in candidates
                and (kind is None or field.kafka_type == kind)
                and (size is None or field.size == size)
            ):
                return index
        return None

    partition = find("partition_index", "index", "partition", size=4)
    holds_partitions = any(f.struct is not None for f in plan.fields)
    return _Slots(
        topic=find("name", "topic", kind="string") if holds_partitions else None,
        topic_id=find("topic_id", kind="uuid") if holds_partitions else None,
        partition=partition,
        error=find("error_code", size=2) if partition is not None else None,
        leader=find("leader_id", size=4)
        if partition is not None and "leader_id" in names
        else None,
    )


class _Walk(ByteWalk):
    """Walks a whole message, noting each partition's answer under its topic."""

    __slots__ = ("found", "topic", "topic_id")

    def __init__(self, buf: bytes) -> None:
        super().__init__(buf, keep_address)
        self.found: list[PartitionAnswer] = []
        self.topic: str | None = None
        self.topic_id: str | None = None

    def struct(self, plan: StructPlan, pos: int, node_id: int | None, top: bool = False) -> int:
        slots = _slots(plan)
        if slots.partition is None and slots.topic is None and slots.topic_id is None:
            return self.skim(plan, pos, node_id)
        buf = self.buf
        partition = error = leader = None
        for index, field in enumerate(plan.fields):
            if index == slots.topic:
                self.topic, pos = wire.read_string(buf, pos, plan.flexible)
            elif index == slots.topic_id:
                wire.need(buf, pos, 16, field.name)
                found = uuid.UUID(bytes=bytes(buf[pos : pos + 16]))
                self.topic_id = None if found == _NO_TOPIC_ID else str(found)
                pos += 16
            elif index == slots.partition:
                partition, pos = wire.read_int32(buf, pos)
            elif index == slots.error:
                error, pos = wire.read_int16(buf, pos)
            elif index == slots.leader:
                leader, pos = wire.read_int32(buf, pos)
            else:
                pos = self.field(field, pos, node_id)
        if partition is not None and error is not None:
            self.found.append(PartitionAnswer(self.topic, self.topic_id, partition, error, leader))
        if plan.flexible:
            pos = self.tagged(plan, pos, node_id)
        return pos


def partition_answers(
    frame: bytes, api_key: int, api_version: int, body: int
) -> list[PartitionAnswer]:
    """Each partition a Produce, Fetch, ListOffsets or Metadata answer speaks for (the body
    starts at `body`). Raises ProtocolError when the bytes do not follow the schema."""
    walk = _Walk(frame)
    walk.struct(response_plan(api_key, api_version), body, None)
    return walk.found


def fetch_rack(frame: bytes, api_version: int, body: int) -> str | None:
    """A Fetch request's rack id (v11+): a consumer that names its rack may be sent to a
    follower (KIP-392), whose answers then say nothing about leadership."""
    if api_version < 11:
        return None
    plan = request_plan(FETCH, api_version)
    walk = _RackWalk(frame)
    walk.struct(plan, body, None)
    return walk.rack


class _RackWalk(ByteWalk):
    __slots__ = ("rack",)

    def __init__(self, buf: bytes) -> None:
        super().__init__(buf, keep_address)
        self.rack: str | None = None

    def struct(self, plan: StructPlan, pos: int, node_id: int | None, top: bool = False) -> int:
        if plan.fields and plan.fields[-1].name != "rack_id":
            return self.skim(plan, pos, node_id)
        for field in plan.fields[:-1]:
            pos = self.field(field, pos, node_id)
        self.rack, pos = wire.read_string(self.buf, pos, plan.flexible)
        return self.tagged(plan, pos, node_id) if plan.flexible else pos
