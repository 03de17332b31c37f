"""The policy: which requests `up --read-only`, `--deny-api` and `--allow-api` refuse."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map

from kafkatunnel.protocol import (
    READ_ONLY,
    Policy,
    PolicyError,
    cap_api_versions,
    narrowest,
    parse_request_header,
)
from kafkatunnel.protocol.policy import PASSES, SOME, UNREFUSABLE, GroupMembers
from kafkatunnel.protocol.rewrite import rewrite_caps
from tests.kio_messages import decode, encode, request_frame, response_frame
from tests.protocol.requests_built import built
from tests.protocol.test_passage import NO_TIME

pytestmark = pytest.mark.quick

# What a consumer, a share consumer and a look at the cluster send: never refused by
# read-only, whatever the request says. The allow-list, reviewed: a new entry here is a
# decision (see the policy's docstring), and any API not here nor in DECIDED is refused.
READS = ("Metadata", "Fetch", "ListOffsets", "OffsetFetch", "FindCoordinator", "JoinGroup",
         "SyncGroup", "Heartbeat", "ShareFetch", "ShareAcknowledge", "DescribeGroups",
         "ListGroups", "DescribeConfigs", "DescribeCluster", "DescribeAcls",
         "DescribeTopicPartitions", "OffsetForLeaderEpoch", "ApiVersions", "SaslHandshake",
         "SaslAuthenticate", "DescribeLogDirs", "DescribeProducers", "DescribeTransactions",
         "ListTransactions", "DescribeClientQuotas", "DescribeUserScramCredentials",
         "ConsumerGroupDescribe", "ShareGroupDescribe", "GetTelemetrySubscriptions",
         "PushTelemetry", "DescribeShareGroupOffsets", "DescribeDelegationToken",
         "ListPartitionReassignments", "DescribeQuorum", "ListConfigResources",
         "StreamsGroupDescribe")  # fmt: skip
# Decided on what the request says (and, leaving a group, on who the client has been).
DECIDED = ("OffsetCommit", "InitProducerId", "LeaveGroup", "ConsumerGroupHeartbeat",
           "ShareGroupHeartbeat", "StreamsGroupHeartbeat")  # fmt: skip
CHANGES = ("Produce", "DeleteRecords", "CreateTopics", "DeleteTopics", "CreatePartitions",
           "AlterConfigs", "IncrementalAlterConfigs", "AlterPartitionReassignments",
           "ElectLeaders", "DeleteGroups", "OffsetDelete", "CreateAcls", "DeleteAcls",
           "AlterClientQuotas", "AlterUserScramCredentials", "AddPartitionsToTxn",
           "AddOffsetsToTxn", "EndTxn", "TxnOffsetCommit", "AlterReplicaLogDirs",
           "UpdateFeatures", "UnregisterBroker", "AlterShareGroupOffsets",
           "DeleteShareGroupOffsets", "WriteTxnMarkers")  # fmt: skip
KEYS = {"".join(p.capitalize() for p in n.split("_")): k for k, n in api_key_map.items()}


def _refused(policy: Policy, api: str, **fields: object) -> bool:
    key = KEYS[api]
    versions = sorted(schema_name_map[api_key_map[key]])
    answers = set()
    for version in versions:
        request = built(key, version, **fields)
        wire = request_frame(request)
        header = parse_request_header(wire)
        answers.add(policy.held(key) and policy.refuses(header, wire))
    assert len(answers) == 1, f"{api}: refused at some versions only"
    return answers.pop()


def test_read_only_refuses_what_changes_the_cluster_and_passes_what_reads() -> None:
    policy = Policy.of(read_only=True)
    assert policy is not None
    for api in CHANGES:
        assert _refused(policy, api), api
    for api in READS:
        assert not _refused(policy, api), api
    assert {KEYS[a] for a in CHANGES} <= READ_ONLY


def test_read_only_is_an_allow_list_of_every_api_kio_knows() -> None:
    """What passes is READS and what is decided is DECIDED, exactly: every other API kio
    knows is refused (one added to Kafka and kio later among them), and so is any API kio
    does not know."""
    assert {KEYS[a] for a in READS} == PASSES | UNREFUSABLE
    assert {KEYS[a] for a in DECIDED} == SOME
    assert set(api_key_map) - PASSES - SOME - UNREFUSABLE == READ_ONLY
    policy = Policy.of(read_only=True)
    assert policy is not None
    unknown = max(api_key_map) + 1
    assert unknown not in api_key_map
    wire = struct.pack(">ihhi", 10, unknown, 0, 1) + b"\x00\x00"  # no client id
    header = parse_request_header(wire)
    assert policy.held(unknown) and policy.refuses(header, wire)


def test_a_commit_by_a_member_passes_and_one_from_outside_the_group_is_refused() -> None:
    """A consumer commits with its generation (or member epoch), 1 or more; Kafka takes a
    commit with one below 0 on an empty group whatever member id it names, so every such
    commit is refused (Admin's alterConsumerGroupOffsets, --reset-offsets --execute)."""
    policy = Policy.of(read_only=True)
    assert policy is not None
    member = {"member_id": "consumer-1-ab", "generation_id_or_member_epoch": 4}
    assert not _refused(policy, "OffsetCommit", **member)
    assert _refused(policy, "OffsetCommit", member_id="", generation_id_or_member_epoch=-1)
    assert _refused(policy, "OffsetCommit", member_id="x", generation_id_or_member_epoch=-1)


def _decided(policy: Policy, seen: GroupMembers, api: str, version: int, **fields: object) -> bool:
    wire = request_frame(built(KEYS[api], version, **fields))
    header = parse_request_header(wire)
    return policy.held(header.api_key) and policy.refuses(header, wire, seen)


JOINED = {"group_id": "orders", "member_id": "consumer-1-ab"}


@pytest.mark.parametrize("noted_by", ["JoinGroup", "SyncGroup", "Heartbeat"])
def test_a_member_leaves_only_as_itself(noted_by: str) -> None:
    """A consumer's LeaveGroup names the member its own JoinGroup, SyncGroup and heartbeats
    named on the connection; one naming another member (Admin's
    removeMembersFromConsumerGroup, kafka-streams-application-reset --force) is refused."""
    policy = Policy.of(read_only=True)
    assert policy is not None
    members = GroupMembers()
    version = max(schema_name_map[api_key_map[KEYS[noted_by]]])
    assert not _decided(policy, members, noted_by, version, **JOINED)
    for v in (0, 1, 2):
        assert not _decided(policy, members, "LeaveGroup", v, **JOINED)
        assert _decided(policy, members, "LeaveGroup", v, group_id="orders", member_id="other")
        assert _decided(policy, GroupMembers(), "LeaveGroup", v, **JOINED)  # another connection
    for v in (3, 4, 5):
        leave = built(13, v).members[0]
        own = dataclasses.replace(leave, member_id="consumer-1-ab", group_instance_id=None)
        static = dataclasses.replace(leave, member_id="", group_instance_id="orders-0")
        assert not _decided(policy, members, "LeaveGroup", v, group_id="orders", members=(own,))
        for batch in [(static,), (own, static), ()]:
            assert _decided(policy, members, "LeaveGroup", v, group_id="orders", members=batch)
        other_group = {"group_id": "payments", "members": (own,)}
        assert _decided(policy, members, "LeaveGroup", v, **other_group)


@pytest.mark.parametrize("api", ["ConsumerGroupHeartbeat", "ShareGroupHeartbeat"])
def test_a_kip_848_member_stays_as_anyone_and_leaves_only_as_itself(api: str) -> None:
    """Member epoch 0 or more: joining or staying, passes (and names the member); below 0
    (-1 leaving, -2 a static member leaving for now) only as a member the connection was."""
    policy = Policy.of(read_only=True)
    assert policy is not None
    members = GroupMembers()
    version = max(schema_name_map[api_key_map[KEYS[api]]])
    assert not _decided(policy, members, api, version, member_epoch=0, **JOINED)
    assert not _decided(policy, members, api, version, member_epoch=7, group_id="orders",
                        member_id="another")  # fmt: skip
    assert not _decided(policy, members, api, version, member_epoch=-1, **JOINED)
    assert _decided(policy, members, api, version, member_epoch=-1, group_id="orders",
                    member_id="never-seen")  # fmt: skip
    assert _decided(policy, GroupMembers(), api, version, member_epoch=-2, **JOINED)


def test_a_streams_member_without_a_topology_passes_and_one_with_a_topology_is_refused() -> None:
    """Kafka 4.1+ creates the internal topics a StreamsGroupHeartbeat's topology names and
    that are missing; shutdown_application stops the deployed members too."""
    policy = Policy.of(read_only=True)
    assert policy is not None
    members = GroupMembers()
    staying = {"member_epoch": 3, "shutdown_application": False, **JOINED}
    assert not _decided(policy, members, "StreamsGroupHeartbeat", 0, topology=None, **staying)
    assert _decided(policy, members, "StreamsGroupHeartbeat", 0, **staying)  # built: a topology
    shutdown = {**staying, "shutdown_application": True}
    assert _decided(policy, members, "StreamsGroupHeartbeat", 0, topology=None, **shutdown)


def test_a_refused_request_names_no_member() -> None:
    """A refused heartbeat (a topology's) does not make its member the client's own."""
    policy = Policy.of(read_only=True)
    assert policy is not None
    members = GroupMembers()
    assert _decided(policy, members, "StreamsGroupHeartbeat", 0, member_epoch=0,
                    shutdown_application=False, **JOINED)  # fmt: skip
    assert not members.has("orders", "consumer-1-ab")


def test_members_noted_are_bounded() -> None:
    members = GroupMembers()
    for i in range(GroupMembers.LIMIT + 10):
        members.note("g", f"m-{i}")
    assert not members.has("g", "m-0") and members.has("g", f"m-{GroupMembers.LIMIT + 9}")
    members.note("g", "")  # no member id: nothing to note
    assert not members.has("g", "")


def test_caps_hold_the_held_apis_to_what_can_be_refused_and_drop_unknown_keys() -> None:
    """A version past kio's of an API a policy holds could not be answered with a refusal:
    ApiVersions offers only those the tunnel can read; an API kio does not know, none."""
    policy = Policy.of(read_only=True)
    assert policy is not None
    caps = narrowest(rewrite_caps(), policy.caps())
    # OffsetCommit: held; ListOffsets: passes; 1000: unknown
    offers = [(8, 0, 99), (2, 1, 99), (1000, 0, 3)]
    entries = tuple(
        ApiVersion(api_key=k, min_version=low, max_version=high)  # type: ignore[arg-type]
        for k, low, high in offers
    )
    listed = ApiVersionsResponse(error_code=ErrorCode.none, api_keys=entries, throttle_time=NO_TIME)
    answer = cap_api_versions(response_frame(18, 3, encode(listed), 1), 3, caps)
    body = decode(ApiVersionsResponse, answer[8:])
    offered = {a.api_key: (a.min_version, a.max_version) for a in body.api_keys}
    known = sorted(schema_name_map[api_key_map[8]])
    assert offered == {8: (known[0], known[-1]), 2: (1, 99)}
    deny_only = Policy.of(deny=["DeleteTopics"])
    assert deny_only is not None
    capped = cap_api_versions(response_frame(18, 3, encode(listed), 1), 3, deny_only.caps())
    assert {a.api_key for a in decode(ApiVersionsResponse, capped[8:]).api_keys} == {8, 2, 1000}


def test_an_idempotent_producer_gets_its_id_and_a_transactional_one_is_refused() -> None:
    policy = Policy.of(read_only=True)
    assert policy is not None
    assert not _refused(policy, "InitProducerId", transactional_id=None)
    assert _refused(policy, "InitProducerId", transactional_id="orders-tx")


def test_deny_adds_allow_lifts_and_names_are_kafkas_in_any_spelling() -> None:
    deny = Policy.of(deny=["DeleteTopics", "create_topics", "ELECTLEADERS"])
    assert deny is not None
    assert _refused(deny, "DeleteTopics") and _refused(deny, "CreateTopics")
    assert _refused(deny, "ElectLeaders") and not _refused(deny, "Produce")
    lifted = Policy.of(read_only=True, allow=["Produce", "OffsetCommit"])
    assert lifted is not None
    assert not _refused(lifted, "Produce", acks=1)
    assert not _refused(lifted, "OffsetCommit", member_id="", generation_id_or_member_epoch=-1)
    assert _refused(lifted, "DeleteTopics")
    assert Policy.of() is None  # nothing refused: no policy, no cost


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"deny": ["DeleteTopic"]}, "'DeleteTopic' is not a Kafka API name; the names are: "),
        ({"deny": ["ApiVersions"]}, "ApiVersions cannot be denied"),
        ({"deny": ["Produce"], "allow": ["produce"]}, "Produce: both denied and allowed"),
        ({"allow": ["Metadata"]}, "Metadata: not refused, so there is nothing to allow"),
    ],
)
def test_a_policy_that_cannot_be_says_why(settings: dict[str, list[str]], said: str) -> None:
    with pytest.raises(PolicyError) as raised:
        Policy.of(**settings)  # type: ignore[arg-type]
    assert said in str(raised.value)
    if "names are" in said:
        assert "DeleteTopics" in str(raised.value)


OWN_GROUP_APIS = ("OffsetCommit", "OffsetDelete", "DeleteGroups", "AlterShareGroupOffsets",
                  "DeleteShareGroupOffsets")  # fmt: skip


def test_isolating_read_only_lets_a_groups_own_commits_and_deletion_through() -> None:
    """With --isolate every group a client names is its own: its commits (any generation,
    an assign()ing consumer's or --reset-offsets') and the deletion of its offsets or of the
    group pass; everything else read-only refuses stays refused."""
    isolating = Policy.of(read_only=True, isolated=True)
    plain = Policy.of(read_only=True)
    assert isolating is not None and plain is not None
    outside = {"member_id": "", "generation_id_or_member_epoch": -1}
    assert _refused(plain, "OffsetCommit", **outside)
    assert not _refused(isolating, "OffsetCommit", **outside)
    for api in OWN_GROUP_APIS[1:]:
        assert _refused(plain, api) and not _refused(isolating, api), api
    for api in set(CHANGES) - set(OWN_GROUP_APIS):
        assert _refused(isolating, api), api
    assert _refused(isolating, "InitProducerId", transactional_id="orders-tx")
    denied = Policy.of(read_only=True, deny=["DeleteGroups"], isolated=True)
    assert denied is not None and _refused(denied, "DeleteGroups")  # the user's word stands


def test_every_api_isolating_read_only_lets_through_has_its_groups_isolated() -> None:
    """What OWN_GROUPS lets through is safe only because each of its group ids is mapped:
    every version of each carries at least one id the isolation rewrites."""
    from kafkatunnel.protocol.isolation import request_ids

    for api in OWN_GROUP_APIS:
        for version in sorted(schema_name_map[api_key_map[KEYS[api]]]):
            plan = request_ids(KEYS[api], version)
            assert plan is not None and (plan.groups or plan.inner), (api, version)


STREAMS_JOIN = {"protocol_type": "consumer", **JOINED}


def _join(name: str) -> dict[str, object]:
    from kio.schema.join_group.v9.request import JoinGroupRequestProtocol

    return {"protocols": (JoinGroupRequestProtocol(name=name, metadata=b""),), **STREAMS_JOIN}


def test_isolating_refuses_a_kafka_streams_member_and_says_why() -> None:
    """Streams' application id also prefixes its internal topics, the deployed
    application's: isolating refuses its classic JoinGroup (assignor `stream`) and its
    StreamsGroupHeartbeat, with a reason naming what to do; a plain consumer joins."""
    isolating = Policy.of(isolated=True)
    assert isolating is not None and Policy.of() is None
    members = GroupMembers()
    assert _decided(isolating, members, "JoinGroup", 9, **_join("stream"))
    assert not _decided(isolating, members, "JoinGroup", 9, **_join("range"))
    assert not _decided(isolating, members, "JoinGroup", 9, **_join("cooperative-sticky"))
    assert _decided(isolating, members, "StreamsGroupHeartbeat", 0, member_epoch=0,
                    shutdown_application=False, topology=None, **JOINED)  # fmt: skip
    assert "application.id" in isolating.reason_for(KEYS["JoinGroup"])
    assert "application.id" in isolating.reason_for(KEYS["StreamsGroupHeartbeat"])
    streams = ["JoinGroup (Kafka Streams)", "StreamsGroupHeartbeat (Kafka Streams)"]
    assert isolating.names() == streams
    assert not _decided(isolating, members, "Heartbeat", 4, generation_id=1, **JOINED)


def test_an_isolating_tunnel_refuses_kafka_streams_whatever_policy_it_was_given() -> None:
    """Policy.guarding makes any policy (none, a read-only one, one with the tunnel's own
    login) refuse a Streams member when the tunnel isolates, and keeps the rest of it."""
    join = KEYS["JoinGroup"]
    for given in (None, Policy.of(read_only=True), Policy.of(isolated=True)):
        for login in (None, "alice (SCRAM-SHA-256)"):
            guard = Policy.guarding(given, login, isolated=True)
            assert guard is not None and guard.isolated and guard.held(join), (given, login)
            assert guard.login == login
            assert guard.read_only == (given is not None and given.read_only)
    assert Policy.guarding(None, None) is None
    plain = Policy.guarding(Policy.of(read_only=True), None)
    assert plain is not None and not plain.isolated
