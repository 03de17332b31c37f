"""The policy: which requests `up --read-only`, `--deny-api` and `--allow-api` refuse."""

from __future__ import annotations

import pytest
from kio.schema.index import api_key_map, schema_name_map

from kafkatunnel.protocol import READ_ONLY, Policy, PolicyError, parse_request_header
from tests.kio_messages import request_frame
from tests.protocol.requests_built import built

pytestmark = pytest.mark.quick

# What a consumer, a share consumer and a look at the cluster send: never refused.
READS = ("Metadata", "Fetch", "ListOffsets", "OffsetFetch", "FindCoordinator", "JoinGroup",
         "SyncGroup", "Heartbeat", "LeaveGroup", "ConsumerGroupHeartbeat",
         "ShareGroupHeartbeat", "ShareFetch", "ShareAcknowledge", "StreamsGroupHeartbeat",
         "DescribeGroups", "ListGroups", "DescribeConfigs", "DescribeCluster", "DescribeAcls",
         "DescribeTopicPartitions", "OffsetForLeaderEpoch", "ApiVersions", "SaslHandshake",
         "SaslAuthenticate", "DescribeLogDirs", "DescribeProducers", "DescribeTransactions",
         "ListTransactions", "DescribeClientQuotas", "DescribeUserScramCredentials",
         "ConsumerGroupDescribe", "ShareGroupDescribe", "GetTelemetrySubscriptions",
         "PushTelemetry", "DescribeShareGroupOffsets")  # fmt: skip
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


def test_a_commit_by_a_member_passes_and_one_from_outside_the_group_is_refused() -> None:
    """A consumer commits with its member id and generation (or member epoch); an admin
    tool's commit (alterConsumerGroupOffsets, --reset-offsets --execute) with neither."""
    policy = Policy.of(read_only=True)
    assert policy is not None
    member = {"member_id": "consumer-1-ab", "generation_id_or_member_epoch": 4}
    assert not _refused(policy, "OffsetCommit", **member)
    assert _refused(policy, "OffsetCommit", member_id="", generation_id_or_member_epoch=-1)


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
