"""The verdict for one consumer group or transactional id, from its events and a few facts
about the whole recording. A pure function, so Spark can run it per group anywhere.

Every kind of group is judged alike: classic, consumer (KIP-848), share (KIP-932) and
streams (KIP-1071), each by its own coordinator-scoped requests; its kind (Kafka's group
type) comes from the requests its members sent.

misrouted: a coordinator-scoped request went to a broker other than the coordinator the
latest FindCoordinator answer named (or other than the leader of the key's partition of
__consumer_offsets / __transaction_state, when Metadata for it was recorded); or, on a
connection whose broker is only inferred, the named coordinator kept answering
NOT_COORDINATOR after being looked up again (its address leads to another broker: the single
port-forward failure); or, where brokers check the node a client meant (KIP-1242, Kafka
4.4's brokers and clients), a connection meant for the named coordinator was refused by
another broker in the recording of a look-up that named it, after that look-up and before
the group's last event there (it went on: looked it up again, or sent requests elsewhere),
and none of its requests reached it; or a generation assigned a partition
to two members, or chose a protocol a member did not offer; or a heartbeat was answered,
without an error, with a member epoch lower than the member's own.
Where the recording or the user says which broker a connection reached, NOT_COORDINATOR
from the broker FindCoordinator named is that broker not being ready (loading a new
__consumer_offsets, taking over from a restarted broker), never a misroute.
unverified: nothing could be checked (no lookup recorded, brokers unknown).
ok: at least one request checked, nothing wrong. Transient coordinator errors are counted.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kafkatunnel.protocol import COORDINATOR_ERRORS, NOT_COORDINATOR, api_title, partition_for
from kafkatunnel.verify.calls import Conn
from kafkatunnel.verify.events import (
    CALL,
    CONSUMER_GROUP_HEARTBEAT,
    EPOCH_HEARTBEATS,
    JOIN_GROUP,
    LOOKUP,
    SHARE_GROUP_HEARTBEAT,
    STREAMS_GROUP_HEARTBEAT,
    SYNC_GROUP,
    TRANSACTION,
    Event,
)
from kafkatunnel.verify.identity import Identities

OK, MISROUTED, UNVERIFIED = "ok", "misrouted", "unverified"
PERSISTENT_DENIALS = 3  # NOT_COORDINATOR answers from a coordinator re-named in between
# A group's type, as Kafka names it (ListGroups' GroupType): from the requests only its
# members send (the last one wins: a classic group can be upgraded online to a consumer
# group), or else from a successful describe of that type.
CLASSIC, CONSUMER, SHARE, STREAMS = "classic", "consumer", "share", "streams"
MEMBERSHIP_TYPES = {JOIN_GROUP: CLASSIC, 12: CLASSIC, 13: CLASSIC, SYNC_GROUP: CLASSIC,
                    CONSUMER_GROUP_HEARTBEAT: CONSUMER, SHARE_GROUP_HEARTBEAT: SHARE,
                    STREAMS_GROUP_HEARTBEAT: STREAMS}  # fmt: skip
DESCRIBED_TYPES = {69: CONSUMER, 77: SHARE, 89: STREAMS, 90: SHARE, 91: SHARE, 92: SHARE}


class LeaderSnapshot(NamedTuple):
    """Who led each partition of a coordinator topic, as a Metadata answer said."""

    ts: int
    partitions: int  # how many the topic has
    leaders: dict[int, int]  # partition -> leader node id


@dataclass
class Facts:
    """What the whole recording says about brokers, collected before groups are judged."""

    address_nodes: dict[str, int] = field(default_factory=dict)
    advertised: set[tuple[int, str]] = field(default_factory=set)  # (node, address) named
    # per key type: snapshots, sorted by time
    leaders: dict[int, list[LeaderSnapshot]] = field(default_factory=dict)
    identities: Identities | None = None  # which broker is behind each server address
    # (run, node, client id) -> when that client's connections meant for the node reached
    # another broker, which refused them (KIP-1242's check), sorted
    misdirected: dict[tuple[str, int, str | None], list[int]] = field(default_factory=dict)

    def told(self, conn: Conn) -> bool:
        """Whether the broker behind a connection is known rather than inferred: a
        kafkatunnel listener's, or an address the user named with `--broker`."""
        if conn.node is not None:
            return True
        return self.identities is not None and self.identities.told(conn.server)

    def node_of(self, conn: Conn) -> int | None:
        if conn.node is not None:
            return conn.node
        if self.identities is not None:
            found = self.identities.node_of(conn.key, conn.server)
        else:
            found = self.address_nodes.get(conn.server)
        if found is None and conn.advertised is not None:
            found = self.address_nodes.get(conn.advertised)
        return found

    def leader_at(self, key_type: int, key: str, ts: int) -> tuple[int, int] | None:
        """(partition, leader) of the key per the latest Metadata before ts."""
        snapshots = self.leaders.get(key_type)
        if not snapshots:
            return None
        index = bisect.bisect_right([s.ts for s in snapshots], ts) - 1
        if index < 0:
            return None
        _ts, count, leaders = snapshots[index]
        partition = partition_for(key, count)
        leader = leaders.get(partition)
        return None if leader is None or leader < 0 else (partition, leader)


@dataclass
class Verdict:
    key: str
    key_type: int
    verdict: str
    reasons: list[str]
    checked: int
    coordinator: int | None
    errors: dict[str, int]
    timeline: list[dict[str, Any]]
    start: int = 0  # the timeline's zero, in capture time (ns)
    tool: str | None = None  # the client id, when all its traffic was this tool's own
    group_type: str | None = None  # classic, consumer, share, streams; None: not known
    # The name its client used, when an isolating tunnel (up --isolate) made the key
    # NAME.SUFFIX on the cluster; None otherwise.
    client_key: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "client_key": self.client_key,
            "kind": "transactional_id" if self.key_type == TRANSACTION else "group",
            "group_type": self.group_type,
            "verdict": self.verdict,
            "reasons": self.reasons,
            "checked": self.checked,
            "coordinator": self.coordinator,
            "errors": self.errors,
            "timeline": self.timeline,
            "tool": self.tool,
        }


def judge(key: str, key_type: int, events: list[Event], facts: Facts) -> Verdict:
    events = sorted(events, key=lambda e: (e.ts, e.kind != LOOKUP))
    wrong: list[str] = []
    notes: list[str] = []
    errors = dict.fromkeys(COORDINATOR_ERRORS.values(), 0)
    checked = unknown_broker = unlooked = accepted = 0
    named: int | None = None
    lookups: list[Lookup] = []  # each naming a broker
    denied: dict[int, int] = {}  # node -> NOT_COORDINATOR answers since first denial
    renamed: set[int] = set()  # denied nodes a lookup named again
    last_error: int | None = None
    last_denial: tuple[int, bool] | None = None  # (node, the named one on a told connection)
    not_ready: set[int] = set()  # named, reached, and denying: a coordinator still loading
    timeline: list[dict[str, Any]] = []
    start = events[0].ts if events else 0
    for event in events:
        if event.error in COORDINATOR_ERRORS:
            errors[COORDINATOR_ERRORS[event.error]] += 1
        if event.kind == LOOKUP:
            timeline.append(_moment(event, start, event.node, "FindCoordinator"))
            if event.error == 0 and event.node is not None and event.node >= 0:
                named = event.node
                lookups.append(Lookup(event.conn.run, event.ts, named, event.client_id))
                if named in denied:
                    renamed.add(named)
            continue
        if event.kind != CALL:
            continue
        node = facts.node_of(event.conn)
        timeline.append(_moment(event, start, node, api_title(event.api_key)))
        if event.error is not None:
            last_error = event.error
        if node is None:
            unknown_broker += 1
            if event.error == 0:
                accepted += 1  # a broker answered as the coordinator: whichever, it was reached
        if named is None:
            unlooked += 1
        elif node is not None and node != named:
            wrong.append(
                f"{api_title(event.api_key)} went to broker {node}, but FindCoordinator "
                f"named broker {named}"
            )
        elif node is not None:
            checked += 1
        leader = facts.leader_at(key_type, key, event.ts)
        if leader is not None and node is not None:
            partition, leader_node = leader
            topic = "__transaction_state" if key_type == TRANSACTION else "__consumer_offsets"
            if leader_node != node:
                wrong.append(
                    f"{api_title(event.api_key)} went to broker {node}, but broker {leader_node} "
                    f"leads {topic} partition {partition}"
                )
            elif named is None:
                checked += 1
        if event.error == NOT_COORDINATOR and node is not None:
            denied[node] = denied.get(node, 0) + 1
            if node in renamed and denied[node] == PERSISTENT_DENIALS:
                if facts.told(event.conn):
                    not_ready.add(node)
                else:
                    wrong.append(
                        f"broker {node} answered NOT_COORDINATOR {denied[node]} times although "
                        "FindCoordinator kept naming it: its address leads to another broker"
                    )
            last_denial = (node, facts.told(event.conn) and node == named)
    if last_error == NOT_COORDINATOR and not any("NOT_COORDINATOR" in w for w in wrong):
        if last_denial is not None and last_denial[1]:
            not_ready.add(last_denial[0])
        else:
            wrong.append("its last answer was NOT_COORDINATOR: it never reached its coordinator")
    notes.extend(
        f"broker {node}, which FindCoordinator named and the recording shows was reached, "
        "answered NOT_COORDINATOR again and again: it was not ready yet (loading what it "
        "coordinates, or taking it over from another broker), not misrouted"
        for node in sorted(not_ready)
    )
    reached = checked or accepted
    refused = _refused(named, lookups, facts) if named is not None and not reached else 0
    if refused:
        wrong.append(
            f"FindCoordinator named broker {named}, but {refused} connection(s) meant for broker "
            f"{named} reached another broker, which refused them (ApiVersions answered "
            "REBOOTSTRAP_REQUIRED, KIP-1242): its address leads to another broker"
        )
    wrong.extend(_membership_problems(events))
    if errors["NOT_COORDINATOR"] and not wrong:
        notes.append(f"{errors['NOT_COORDINATOR']} NOT_COORDINATOR answer(s), then recovered")
    if unlooked and not checked:
        notes.append("no FindCoordinator answer for it was recorded before its requests")
    if unknown_broker:
        notes.append(f"{unknown_broker} request(s) on connections to brokers the recording "
                     "does not identify")  # fmt: skip
    if not any(e.kind == CALL for e in events):
        notes.append("no coordinator-scoped request was recorded")
    verdict = MISROUTED if wrong else (OK if checked else UNVERIFIED)
    tools = {e.conn.tool for e in events}
    tool = tools.pop() if len(tools) == 1 else None
    if tool is not None and verdict == UNVERIFIED:
        notes.append(f"{tool}'s own look-up (by its client id), not an application's group")
    group_type = None if key_type == TRANSACTION else group_type_of(events)
    return Verdict(key, key_type, verdict, _unique(wrong) + notes, checked, named, errors,
                   timeline, start, tool, group_type)  # fmt: skip


class Lookup(NamedTuple):
    """A look-up of the group's that named a broker: in which run, when, by which client."""

    run: str
    ts: int
    node: int
    client_id: str | None


def _refused(named: int, lookups: list[Lookup], facts: Facts) -> int:
    """Connections meant for the named coordinator that another broker refused (KIP-1242),
    made by a client that looked the group's coordinator up (its client.id), in the run of
    that look-up and after it: the group's own client refused on its way to the broker it
    was told, not another client's (a doctor's smoke group looks up as kafkatunnel-doctor),
    nor one in another recording or from before."""
    firsts: dict[tuple[str, str | None], int] = {}
    for lookup in lookups:
        if lookup.node == named:
            key = (lookup.run, lookup.client_id)
            firsts[key] = min(firsts.get(key, lookup.ts), lookup.ts)
    count = 0
    for (run, client_id), first in firsts.items():
        times = facts.misdirected.get((run, named, client_id), [])
        count += len(times) - bisect.bisect_right(times, first)
    return count


def group_type_of(events: list[Event]) -> str | None:
    """classic, consumer, share or streams, from the requests of the group's members (in
    time order), or from a successful describe of one type; None when neither was seen."""
    membership = [MEMBERSHIP_TYPES[e.api_key] for e in events
                  if e.kind == CALL and e.api_key in MEMBERSHIP_TYPES]  # fmt: skip
    if membership:
        return membership[-1]
    described = [DESCRIBED_TYPES[e.api_key] for e in events
                 if e.kind == CALL and e.api_key in DESCRIBED_TYPES and e.error == 0]  # fmt: skip
    return described[-1] if described else None


def _unique(items: list[str]) -> list[str]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return [item if n == 1 else f"{item} (x{n})" for item, n in counts.items()]


def _moment(event: Event, start: int, node: int | None, what: str) -> dict[str, Any]:
    detail = event.detail or {}
    return {
        "t_ms": round((event.ts - start) / 1e6, 3),
        "api": what,
        "broker": node,
        "error": None if event.error is None else COORDINATOR_ERRORS.get(event.error, event.error),
        "member": detail.get("member"),
        "generation": detail.get("generation"),
        "epoch": detail.get("epoch"),  # a consumer, share or streams member's
    }


def _membership_problems(events: list[Event]) -> list[str]:
    """Within a generation: each partition to one member; a chosen protocol all offered.
    A member epoch never goes back: a coordinator answers a heartbeat with the member's
    epoch or a newer one, or with an error (FENCED_MEMBER_EPOCH)."""
    problems = _epochs_gone_back(events)
    chosen: dict[int, str] = {}
    offered: dict[int, dict[str, list[str]]] = {}
    owners: dict[int, dict[tuple[str, int], set[str]]] = {}
    for event in events:
        detail = event.detail
        if event.kind != CALL or not detail or event.error not in (0, None):
            continue
        generation = detail.get("generation")
        if not isinstance(generation, int) or generation < 0:
            continue
        if event.api_key == JOIN_GROUP and event.error == 0:
            if detail.get("chosen"):
                chosen[generation] = detail["chosen"]
            offered.setdefault(generation, {})[detail["member"]] = detail["offered"]
        elif event.api_key == SYNC_GROUP:
            given = dict(detail.get("assignments") or {})
            if event.error == 0 and detail.get("assignment") is not None:
                given[detail["member"]] = detail["assignment"]
            for member, partitions in given.items():
                for topic, partition in partitions or []:
                    owners.setdefault(generation, {}).setdefault((topic, partition), set()).add(
                        member
                    )
    for generation, protocol in sorted(chosen.items()):
        for member, names in sorted(offered.get(generation, {}).items()):
            if protocol not in names:
                problems.append(
                    f"generation {generation} chose protocol {protocol!r}, which member "
                    f"{member} did not offer ({', '.join(names)})"
                )
    for generation, partitions in sorted(owners.items()):
        for (topic, partition), members in sorted(partitions.items()):
            if len(members) > 1:
                problems.append(
                    f"generation {generation} assigned {topic}-{partition} to "
                    f"{len(members)} members ({', '.join(sorted(members))})"
                )
    return problems


def _epochs_gone_back(events: list[Event]) -> list[str]:
    problems = []
    for event in events:
        detail = event.detail
        if event.kind != CALL or event.api_key not in EPOCH_HEARTBEATS or not detail:
            continue
        sent, answered = detail.get("sent", -1), detail.get("epoch", -1)
        if event.error == 0 and sent > 0 and 0 <= answered < sent:
            problems.append(
                f"member {detail['member']} sent epoch {sent} and was answered with epoch "
                f"{answered}: a broker that did not know the group answered as its coordinator"
            )
    return problems
