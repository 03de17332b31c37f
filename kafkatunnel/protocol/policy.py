"""Which requests the tunnel refuses: `up --read-only`, `--deny-api`, `--allow-api`.

A shared cluster is looked at through a laptop far more often than it should be changed
from one. Read-only is an allow-list: the APIs that only read pass, and so does what a
group's members do to stay members and commit their own offsets; every other API,
including those Kafka adds after this was written and those kio does not know, is refused
with its authorization error. Each API let through was checked against Kafka's own broker
(KafkaApis and the group coordinator of Kafka 4.4) for what it changes besides answering.

Some APIs are decided on the request itself, as the broker decides (rules below, in
`_decides`): a commit from outside its group, a transactional producer's InitProducerId, a
member leaving a group as someone else, a Streams member handing the broker a topology (a
Kafka 4.1+ broker creates the missing internal topics a topology names, under the caller's
principal: AutoTopicCreationManager.createStreamsInternalTopics) or asking the whole
application to shut down. To know who a connection's client is in a group, the member ids
its own JoinGroup, SyncGroup and heartbeats name are kept per connection (`GroupMembers`).

With `--isolate` every group id a client sends is its own (isolation), so read-only lets
through what touches only a group: its commits, whatever generation they carry, and the
deletion of its offsets or of the group itself (`down --clean`). The rest stays refused.
A Kafka Streams member is refused when isolating, read-only or not: its application id
also prefixes the internal topics it writes (`APP-...-changelog`, `-repartition`), which
are the deployed application's; a local run needs an application id of its own
(STREAMS_REASON). It is known by its JoinGroup's assignor (`stream`, Streams' classic
protocol) or by StreamsGroupHeartbeat (KIP-1071's).

One API is changed instead: a Metadata request that lets the broker create the topics it
names (allow_auto_topic_creation, v4 on: producers and consumers send it, and brokers
create topics by default) goes on without that permission. Before v4 the permission is not
in the request (the broker's setting decides); Kafka 4 brokers no longer take those versions.

API names are Kafka's (DeleteTopics), matched regardless of case and underscores
(delete_topics, as kio's api_key_map spells them, works too).
"""

from __future__ import annotations

import dataclasses
import functools
import io
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kio.index import load_request_schema
from kio.schema.index import api_key_map
from kio.serial import entity_reader, entity_writer

from kafkatunnel.protocol.api_versions import UNKNOWN_APIS
from kafkatunnel.protocol.framing import SIZE_PREFIX, frame
from kafkatunnel.protocol.headers import RequestHeader
from kafkatunnel.protocol.own_login import LOGIN_APIS, told
from kafkatunnel.protocol.schema import api_title, known_versions

API_VERSIONS = 18
METADATA = 3
# Never refused by the user's flags: every client opens with ApiVersions (and a refusal is
# answered in its place, see passage), and a login must go on for anything else to (the
# client's own login is refused only when the tunnel logs in for it: Policy.login).
UNREFUSABLE = frozenset({API_VERSIONS, *LOGIN_APIS})

# What --read-only lets through whatever the request says: what only reads, by API name,
# so the list reads as the documentation does. Each was read in Kafka 4.4's KafkaApis and
# coordinators for what it changes besides its answer.
READ_ONLY_PASSES = (
    # data: a consumer's fetch (a follower's names a replica: only brokers send those) and
    # offsets
    "Fetch", "ListOffsets", "OffsetForLeaderEpoch", "OffsetFetch",
    # the cluster, topics, configs, ACLs, quotas, users, tokens, logs, quorum: described
    "Metadata", "DescribeCluster", "DescribeTopicPartitions", "DescribeConfigs",
    "ListConfigResources", "DescribeAcls", "DescribeClientQuotas",
    "DescribeUserScramCredentials", "DescribeDelegationToken", "DescribeLogDirs",
    "ListPartitionReassignments", "DescribeQuorum", "DescribeProducers",
    # groups and transactions, described and listed
    "ListGroups", "DescribeGroups", "ConsumerGroupDescribe", "ShareGroupDescribe",
    "StreamsGroupDescribe", "DescribeShareGroupOffsets", "DescribeTransactions",
    "ListTransactions",
    # a coordinator named (the first look-up of a kind creates its internal topic,
    # __consumer_offsets, __transaction_state or __share_group_state, as for any client)
    "FindCoordinator",
    # a group's members: joining, staying, and (share groups) taking and acknowledging
    # their records, their own consumption; a member's id is noted (GroupMembers)
    "JoinGroup", "SyncGroup", "Heartbeat", "ShareFetch", "ShareAcknowledge",
    # the client's own metrics, to the broker's metrics plugin (KIP-714)
    "GetTelemetrySubscriptions", "PushTelemetry",
)  # fmt: skip
# Decided by --read-only on what the request says (see _decides).
READ_ONLY_SOME = (
    "OffsetCommit", "InitProducerId", "LeaveGroup", "ConsumerGroupHeartbeat",
    "ShareGroupHeartbeat", "StreamsGroupHeartbeat",
)  # fmt: skip
# Let through by --read-only when isolating (--isolate): each touches only the groups it
# names, and every group a client names is then its own isolated one.
OWN_GROUPS_ONLY = (
    "OffsetCommit", "OffsetDelete", "DeleteGroups", "AlterShareGroupOffsets",
    "DeleteShareGroupOffsets",
)  # fmt: skip
# Let through by --read-only, and read to note the member a connection's client is.
MEMBERSHIP = ("JoinGroup", "SyncGroup", "Heartbeat")


class PolicyError(ValueError):
    """A policy that cannot be: an unknown API name, one both denied and allowed...;
    `flag` is the `up` flag at fault."""

    def __init__(self, message: str, flag: str = "--deny-api") -> None:
        super().__init__(message)
        self.flag = flag


def _folded(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


@functools.cache
def api_keys_by_name() -> dict[str, int]:
    """Every API kio knows, by its folded name (DeleteTopics, delete_topics: deletetopics)."""
    return {_folded(name): key for key, name in api_key_map.items()}


def api_key_of(name: str) -> int:
    """The key of the API Kafka calls `name`; PolicyError naming the valid names if none."""
    key = api_keys_by_name().get(_folded(name))
    if key is None:
        names = ", ".join(sorted(api_title(k) for k in api_key_map))
        raise PolicyError(f"{name!r} is not a Kafka API name; the names are: {names}")
    return key


PASSES = frozenset(api_key_of(name) for name in READ_ONLY_PASSES)
OWN_GROUPS = frozenset(api_key_of(name) for name in OWN_GROUPS_ONLY)
SOME = frozenset(api_key_of(name) for name in READ_ONLY_SOME)
# What --read-only refuses whatever the request says: every other API kio knows (and any it
# does not know, see Policy.refuses).
READ_ONLY = frozenset(api_key_map) - PASSES - SOME - UNREFUSABLE
OFFSET_COMMIT, INIT_PRODUCER_ID, LEAVE_GROUP = (api_key_of(n) for n in (
    "OffsetCommit", "InitProducerId", "LeaveGroup"))  # fmt: skip
STREAMS_GROUP_HEARTBEAT = api_key_of("StreamsGroupHeartbeat")
# Heartbeats of KIP-848's protocols: a member epoch below 0 leaves the group (-1, or -2 for a
# static member that will come back)
EPOCH_HEARTBEATS = frozenset(
    api_key_of(n) for n in ("ConsumerGroupHeartbeat", "ShareGroupHeartbeat",
                            "StreamsGroupHeartbeat"))  # fmt: skip
JOIN_GROUP = api_key_of("JoinGroup")
STREAMS_ASSIGNOR = "stream"  # StreamsPartitionAssignor.name(), Kafka Streams' classic protocol
# Held when isolating: they say whether their client is a Kafka Streams member
STREAMS_MEMBERSHIP = frozenset({JOIN_GROUP, STREAMS_GROUP_HEARTBEAT})
STREAMS_REASON = (
    "kafkatunnel up --isolate does not isolate Kafka Streams: its internal topics "
    "(APPLICATION_ID-...-changelog, -repartition) would be the deployed application's; give "
    "the local run its own application.id (e.g. APPLICATION_ID-local) instead"
)
# The requests that name the member their client is (read by read-only, see GroupMembers)
NOTED = frozenset(api_key_of(name) for name in MEMBERSHIP) | EPOCH_HEARTBEATS


class GroupMembers:
    """The members a connection's client has been, as (group id, member id): what its own
    JoinGroup, SyncGroup and heartbeats named. A member leaves a group only as one of these:
    a LeaveGroup or a leaving heartbeat that names another member is an admin's (Admin's
    removeMembersFromConsumerGroup, `kafka-streams-application-reset --force`), and would
    take a deployed application's members out of their group. A client's coordinator
    traffic (join, sync, heartbeats, leave) goes over one connection to its coordinator.
    Bounded: a client is a member of a handful of groups, and a rejoin gets a new id."""

    LIMIT = 64

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], None] = {}  # in the order noted, oldest first

    def note(self, group: object, member: object) -> None:
        if not isinstance(group, str) or not isinstance(member, str) or not member:
            return
        seen = self._seen
        seen.pop((group, member), None)
        seen[(group, member)] = None
        if len(seen) > self.LIMIT:
            del seen[next(iter(seen))]

    def has(self, group: object, member: object) -> bool:
        return (group, member) in self._seen


@dataclass(frozen=True)
class Policy:
    """APIs refused outright, APIs refused when the request changes things (SOME), and
    whether read-only's other rules apply: an API this layer does not know is refused (it
    could change anything), Metadata is amended, and the members a connection's client
    is are noted."""

    refused: frozenset[int]
    some: frozenset[int] = frozenset()
    read_only: bool = False
    reason: str = "the tunnel refuses it"  # what refused clients read in error messages
    # Who the tunnel logs in as, when it does (`alice (SCRAM-SHA-256)`): the client's own
    # SaslHandshake and SaslAuthenticate are refused then, and answered as own_login says.
    login: str | None = None
    # Isolating (`--isolate`): a Kafka Streams member is refused (STREAMS_REASON).
    isolated: bool = False

    @classmethod
    def of(
        cls,
        read_only: bool = False,
        deny: Iterable[str] = (),
        allow: Iterable[str] = (),
        isolated: bool = False,
    ) -> Policy | None:
        """The policy of `up --read-only --deny-api ... --allow-api ...` (None: it refuses
        nothing). An allowed API is never refused, whatever else says so; isolated
        (`--isolate`): read-only lets the groups' own APIs through (OWN_GROUPS)."""
        denied = {api_key_of(name) for name in deny}
        try:
            allowed = {api_key_of(name) for name in allow}
        except PolicyError as error:
            raise PolicyError(str(error), "--allow-api") from None
        both = denied & allowed
        if both:
            named = ", ".join(sorted(api_title(k) for k in both))
            raise PolicyError(f"{named}: both denied and allowed; name each API in one list")
        stuck = denied & UNREFUSABLE
        if stuck:
            named = ", ".join(sorted(api_title(k) for k in stuck))
            raise PolicyError(f"{named} cannot be denied: clients cannot connect without it")
        own = OWN_GROUPS if isolated else frozenset()
        refused = (READ_ONLY - own if read_only else frozenset()) | denied
        some = (SOME - own if read_only else frozenset()) - denied
        idle = allowed - refused - some
        if idle:
            named = ", ".join(sorted(api_title(k) for k in idle))
            raise PolicyError(
                f"{named}: not refused, so there is nothing to allow "
                "(--allow-api lifts a refusal of --read-only or --deny-api)",
                "--allow-api",
            )
        if read_only and not deny:
            reason = "the tunnel is read-only (kafkatunnel up --read-only)"
        else:
            reason = "the tunnel refuses this API (kafkatunnel up --read-only/--deny-api)"
        policy = cls(refused - allowed, some - allowed, read_only, reason, isolated=isolated)
        return policy if policy.refused or policy.some or read_only or isolated else None

    @classmethod
    def guarding(
        cls, policy: Policy | None, login: str | None, isolated: bool = False
    ) -> Policy | None:
        """What a connection follows: the user's policy (None: none); when the tunnel logs
        in as `login`, the refusal of the client's own login; when it isolates, the refusal
        of Kafka Streams (whatever policy the caller made)."""
        if login is None and (not isolated or (policy is not None and policy.isolated)):
            return policy
        guard = policy or cls(frozenset())
        return dataclasses.replace(guard, login=login, isolated=guard.isolated or isolated)

    @functools.cached_property
    def _held(self) -> frozenset[int]:
        held = self.refused | self.some
        if self.read_only:
            held |= NOTED | {METADATA}
        if self.login is not None:
            held |= LOGIN_APIS
        if self.isolated:
            held |= STREAMS_MEMBERSHIP
        return held

    def held(self, api_key: int) -> bool:
        """Whether a request of this API must be held whole to decide (refused, or maybe, a
        Metadata request of read-only's, which may let the broker create topics, or one
        that names the client's member id)."""
        return api_key in self._held or (self.read_only and api_key not in api_key_map)

    def caps(self) -> dict[int, range]:
        """The versions a client may use of each API held: those this layer can read, and
        so refuse with an answer (a version past kio's would end the connection instead,
        and its client reconnect for ever). With read-only, an API kio does not know is
        left out of ApiVersions altogether (UNKNOWN_APIS)."""
        caps = {key: known_versions(key) for key in self._held if key in api_key_map}
        if self.read_only:
            caps[UNKNOWN_APIS] = range(0)
        return caps

    def reason_for(self, api_key: int) -> str:
        """Why a request of this API is refused, in words for messages."""
        if self.login is not None and api_key in LOGIN_APIS:
            return told(self.login)
        if self._streams(api_key) and api_key not in self.refused:
            return STREAMS_REASON
        return self.reason

    def _streams(self, api_key: int) -> bool:
        return self.isolated and api_key in STREAMS_MEMBERSHIP

    def _own_login(self, api_key: int) -> bool:
        return self.login is not None and api_key in LOGIN_APIS

    def amended(self, header: RequestHeader, frame_bytes: bytes) -> bytes | None:
        """The request as it goes on instead, when read-only changes it (a Metadata request
        that lets the broker create topics, without that permission); None: as it is."""
        if not self.read_only or header.api_key != METADATA or header.api_version < 4:
            return None
        try:
            request = read_request(header, frame_bytes)
        except Exception:  # kio's own errors: the broker judges what nobody here can read
            return None
        if not request.allow_auto_topic_creation:
            return None
        assert header.body_offset is not None  # read_request read it
        out = io.BytesIO()
        out.write(frame_bytes[SIZE_PREFIX : header.body_offset])  # the header as it came
        entity_writer(type(request))(
            out, dataclasses.replace(request, allow_auto_topic_creation=False)
        )
        return frame(out.getvalue())

    def refuses(
        self, header: RequestHeader, frame: bytes, members: GroupMembers | None = None
    ) -> bool:
        """Whether this request (a whole frame, size prefix included) is refused. members:
        those the connection's client has been (noted here, from its own requests); a
        request that leaves a group as a member not among them is refused."""
        key = header.api_key
        if key in self.refused or (self.read_only and key not in api_key_map):
            return True
        if self._own_login(key):  # the tunnel logs in: never the client (see own_login)
            return True
        noted = self.read_only and key in NOTED
        streams = self._streams(key)
        if key not in self.some and not noted and not streams:
            return False
        try:
            request = read_request(header, frame)
        except Exception:  # kio's own errors: a request nobody can read is not let through
            return key in self.some or streams
        if streams and _streams_member(key, request):
            return True
        members = GroupMembers() if members is None else members
        refused = key in self.some and _decides(key, request, members)
        if noted and not refused:
            _note(key, request, members)
        return refused

    def names(self) -> list[str]:
        """The APIs refused outright, and those refused for some requests, by name."""
        refused = sorted(api_title(k) for k in self.refused)
        some = sorted(f"{api_title(k)} (some)" for k in self.some)
        streams = sorted(f"{api_title(k)} (Kafka Streams)" for k in STREAMS_MEMBERSHIP
                         if self._streams(k) and k not in self.refused)  # fmt: skip
        return refused + some + streams


def read_request(header: RequestHeader, frame: bytes) -> Any:
    """A request's body, decoded by kio (its errors, or UnsupportedVersion, if it cannot)."""
    if header.body_offset is None:
        raise ValueError(f"API {header.api_key} v{header.api_version} has no schema here")
    request_type: Any = load_request_schema(header.api_key, header.api_version)
    value, _ = entity_reader(request_type)(frame[header.body_offset :], 0)
    return value


def _decides(key: int, request: Any, members: GroupMembers) -> bool:
    """Whether read-only refuses this request of a SOME API, on what it says and on the
    members its connection's client has been."""
    if key == OFFSET_COMMIT:
        # Kafka takes a commit with generation (or member epoch) below 0 on an empty group
        # whatever member it names (ClassicGroup.validateOffsetCommit, ConsumerGroup's the
        # same): Admin's alterConsumerGroupOffsets, `kafka-consumer-groups --reset-offsets
        # --execute`, or a consumer that assign()s itself partitions. A member's own commit
        # always carries its generation or epoch, 1 or more.
        return int(getattr(request, "generation_id_or_member_epoch", -1)) < 0
    if key == INIT_PRODUCER_ID:  # without a transactional id: an idempotent producer's id
        return request.transactional_id is not None
    group = request.group_id
    if key == LEAVE_GROUP:  # v3+ a batch, by member id or (static members) instance id
        leaving = [m.member_id for m in getattr(request, "members", ())] or [
            getattr(request, "member_id", "")
        ]
        return not all(members.has(group, member) for member in leaving)
    if request.member_epoch < 0 and not members.has(group, request.member_id):
        return True  # a heartbeat that leaves the group as another member
    if key == STREAMS_GROUP_HEARTBEAT:
        # A topology makes a Kafka 4.1+ broker create the internal topics it names that are
        # missing (changelogs, repartition topics); shutdown_application stops every
        # member of the application, the deployed ones too.
        return request.topology is not None or bool(request.shutdown_application)
    return False


def _streams_member(key: int, request: Any) -> bool:
    """Whether a JoinGroup or StreamsGroupHeartbeat comes from a Kafka Streams member."""
    if key == STREAMS_GROUP_HEARTBEAT:
        return True
    return any(protocol.name == STREAMS_ASSIGNOR for protocol in request.protocols)


def _note(key: int, request: Any, members: GroupMembers) -> None:
    """The member a request shows its client is: a JoinGroup's (a rejoin names its id), a
    SyncGroup's or heartbeat's, a KIP-848 heartbeat's while it stays (epoch 0 or more)."""
    if key in EPOCH_HEARTBEATS and request.member_epoch < 0:
        return
    members.note(request.group_id, request.member_id)
