"""Which requests the tunnel refuses: `up --read-only`, `--deny-api`, `--allow-api`.

A shared cluster is looked at through a laptop far more often than it should be changed
from one. Read-only refuses every API that changes data, topics, configs, groups' offsets,
ACLs, quotas, users, features, transactions or the cluster's own membership; what reads
(and what a consumer group's members do to stay members and commit their own offsets)
passes. Two APIs are refused only for some requests, read from the request itself:

- OffsetCommit from outside the group: no member id and generation -1, what
  AdminClient.alterConsumerGroupOffsets and `kafka-consumer-groups --reset-offsets
  --execute` send (a consumer that assigns itself partitions and commits without joining
  its group sends the same, and is refused too). A member's commit carries its member id
  and generation (or member epoch, KIP-848).
- InitProducerId with a transactional id (a transactional producer); without one it only
  gives an idempotent producer its id, and that producer's Produce is refused anyway.

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

from kafkatunnel.protocol.framing import SIZE_PREFIX, frame
from kafkatunnel.protocol.headers import RequestHeader
from kafkatunnel.protocol.own_login import LOGIN_APIS, told
from kafkatunnel.protocol.schema import api_title

API_VERSIONS = 18
OFFSET_COMMIT, INIT_PRODUCER_ID, METADATA = 8, 22, 3
# Never refused by the user's flags: every client opens with ApiVersions (and a refusal is
# answered in its place, see passage), and a login must go on for anything else to (the
# client's own login is refused only when the tunnel logs in for it: Policy.login).
UNREFUSABLE = frozenset({API_VERSIONS, *LOGIN_APIS})

# What --read-only refuses, whatever the request says: by API name, so the list reads as
# the documentation does.
READ_ONLY_APIS = (
    # data
    "Produce", "DeleteRecords",
    # topics and partitions
    "CreateTopics", "DeleteTopics", "CreatePartitions", "AlterPartitionReassignments",
    "ElectLeaders", "AlterReplicaLogDirs",
    # configs
    "AlterConfigs", "IncrementalAlterConfigs",
    # groups
    "DeleteGroups", "OffsetDelete", "AlterShareGroupOffsets", "DeleteShareGroupOffsets",
    # transactions
    "AddPartitionsToTxn", "AddOffsetsToTxn", "EndTxn", "TxnOffsetCommit", "WriteTxnMarkers",
    # security: ACLs, quotas, users, tokens
    "CreateAcls", "DeleteAcls", "AlterClientQuotas", "AlterUserScramCredentials",
    "CreateDelegationToken", "RenewDelegationToken", "ExpireDelegationToken",
    # the cluster itself: features, membership, the controllers' and brokers' own APIs
    "UpdateFeatures", "UnregisterBroker", "AddRaftVoter", "RemoveRaftVoter",
    "UpdateRaftVoter", "Vote", "BeginQuorumEpoch", "EndQuorumEpoch", "AlterPartition",
    "Envelope", "BrokerRegistration", "BrokerHeartbeat", "AllocateProducerIds",
    "ControllerRegistration", "AssignReplicasToDirs", "InitializeShareGroupState",
    "WriteShareGroupState", "DeleteShareGroupState",
)  # fmt: skip
# Refused by --read-only only when the request changes what read-only keeps (see above).
READ_ONLY_SOME = ("OffsetCommit", "InitProducerId")


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


READ_ONLY = frozenset(api_key_of(name) for name in READ_ONLY_APIS)
SOME = frozenset(api_key_of(name) for name in READ_ONLY_SOME)


@dataclass(frozen=True)
class Policy:
    """APIs refused outright, APIs refused when the request changes things (SOME), and
    whether an API this layer does not know is refused (read-only: it could change
    anything)."""

    refused: frozenset[int]
    some: frozenset[int] = frozenset()
    read_only: bool = False
    reason: str = "the tunnel refuses it"  # what refused clients read in error messages
    # Who the tunnel logs in as, when it does (`alice (SCRAM-SHA-256)`): the client's own
    # SaslHandshake and SaslAuthenticate are refused then, and answered as own_login says.
    login: str | None = None

    @classmethod
    def of(
        cls, read_only: bool = False, deny: Iterable[str] = (), allow: Iterable[str] = ()
    ) -> Policy | None:
        """The policy of `up --read-only --deny-api ... --allow-api ...` (None: it refuses
        nothing). An allowed API is never refused, whatever else says so."""
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
        refused = (READ_ONLY if read_only else frozenset()) | denied
        some = (SOME if read_only else frozenset()) - denied
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
        policy = cls(refused - allowed, some - allowed, read_only, reason)
        return policy if policy.refused or policy.some or read_only else None

    @classmethod
    def guarding(cls, policy: Policy | None, login: str | None) -> Policy | None:
        """What a connection follows: the user's policy (None: none), and, when the tunnel
        logs in as `login`, the refusal of the client's own login."""
        if login is None:
            return policy
        return dataclasses.replace(policy or cls(frozenset()), login=login)

    def held(self, api_key: int) -> bool:
        """Whether a request of this API must be held whole to decide (refused, or maybe, or
        a Metadata request of read-only's, which may let the broker create topics)."""
        return (
            api_key in self.refused
            or api_key in self.some
            or (self.read_only and (api_key == METADATA or api_key not in api_key_map))
            or self._own_login(api_key)
        )

    def reason_for(self, api_key: int) -> str:
        """Why a request of this API is refused, in words for messages."""
        if self.login is not None and api_key in LOGIN_APIS:
            return told(self.login)
        return self.reason

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

    def refuses(self, header: RequestHeader, frame: bytes) -> bool:
        """Whether this request (a whole frame, size prefix included) is refused."""
        key = header.api_key
        if key in self.refused or (self.read_only and key not in api_key_map):
            return True
        if self._own_login(key):  # the tunnel logs in: never the client (see own_login)
            return True
        if key not in self.some:
            return False
        try:
            request = read_request(header, frame)
        except Exception:  # kio's own errors: a request nobody can read is not let through
            return True
        if key == OFFSET_COMMIT:
            return _from_outside_the_group(request)
        if key == INIT_PRODUCER_ID:
            return request.transactional_id is not None
        return True

    def names(self) -> list[str]:
        """The APIs refused outright, and those refused for some requests, by name."""
        refused = sorted(api_title(k) for k in self.refused)
        some = sorted(f"{api_title(k)} (some)" for k in self.some)
        return refused + some


def read_request(header: RequestHeader, frame: bytes) -> Any:
    """A request's body, decoded by kio (its errors, or UnsupportedVersion, if it cannot)."""
    if header.body_offset is None:
        raise ValueError(f"API {header.api_key} v{header.api_version} has no schema here")
    request_type: Any = load_request_schema(header.api_key, header.api_version)
    value, _ = entity_reader(request_type)(frame[header.body_offset :], 0)
    return value


def _from_outside_the_group(commit: Any) -> bool:
    """An OffsetCommit that names no member of the group: an admin tool's (or a consumer's
    that never joined)."""
    member = getattr(commit, "member_id", "")
    generation = int(getattr(commit, "generation_id_or_member_epoch", -1))
    return not member and generation < 0
