"""The seed's scenario on the last Apache Kafka 3.x (3.9, what many production clusters
still run): three KRaft nodes of its own, formatted as 3.9 formats them, with the same
listeners and names as the reference cluster (tests/worlds/apache.py). Groups
and transactional ids on every coordinator reach it through `up` and are judged ok on the
recording; through the one-forward workaround only broker 0's work, and verify names the
others misrouted on the capture.

The cluster starts once for this module's tests and its JVMs stop when they end; it lives
in a package apart from tests/apache, so it never runs beside the 4.x cluster in one
worker."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafkatunnel.demo import isolation_problem
from kafkatunnel.demo.apache import KAFKA_3_VERSION
from kafkatunnel.demo.workload import consume_group, produce, produce_transaction
from kafkatunnel.probe import ProbeConnection
from tests.apache.test_apache_kafka import tunnel
from tests.apache.test_verify import (
    WORKLOAD,
    one_partition_led_by_broker_0,
    only_broker_0s_work_through_one_forward,
    verify,
)
from tests.worlds.apache import ApacheKafka

MESSAGES = 20
SHARE_GROUP_HEARTBEAT = 76  # Kafka 4's share groups (KIP-932): not in 3.9's answer


@pytest.fixture(scope="module")
def apache_kafka_3() -> Iterator[ApacheKafka]:
    """Apache Kafka 3.9, three KRaft nodes in a network of their own."""
    problem = isolation_problem()
    if problem:
        pytest.skip(f"needs network isolation, which is unavailable: {problem}")
    with ApacheKafka(version=KAFKA_3_VERSION) as kafka:
        yield kafka


def spread(kafka: ApacheKafka, prefix: str) -> tuple[dict[int, str], dict[int, str]]:
    """A group id and a transactional id coordinated by each broker."""
    groups = {n: g for n, (g,) in kafka.groups_by_coordinator(1, f"{prefix}-g").items()}
    ids = {n: t for n, (t,) in kafka.groups_by_coordinator(
        1, f"{prefix}-t", transactional=True).items()}  # fmt: skip
    assert sorted(groups) == sorted(ids) == [0, 1, 2]
    return groups, ids


def test_the_cluster_is_kafka_3_9(apache_kafka_3: ApacheKafka) -> None:
    """Its own tools say 3.9, its brokers offer none of Kafka 4's share groups, and each
    node's output is its log (log4j 1 in 3.x): what a node that dies is shown saying."""
    said = apache_kafka_3.tool("org.apache.kafka.tools.TopicCommand", "--version")
    assert said.startswith(KAFKA_3_VERSION), said
    for node in apache_kafka_3.processes:
        node.wait_for_line(r"\] Kafka Server started", timeout=10)
    with ProbeConnection(apache_kafka_3.bootstrap(), connect=apache_kafka_3.connect) as probe:
        offered = probe.api_versions()
    assert SHARE_GROUP_HEARTBEAT not in offered and 10 in offered, offered


def test_groups_on_every_coordinator_through_the_tunnel_are_judged_ok(
    apache_kafka_3: ApacheKafka, tmp_path: Path
) -> None:
    """Each group reads every message without NOT_COORDINATOR and each transactional id
    commits, through `up --record`; verify --strict judges every one ok."""
    topic = one_partition_led_by_broker_0(apache_kafka_3)
    groups, ids = spread(apache_kafka_3, topic)
    recording = tmp_path / "recording"
    with tunnel(apache_kafka_3, "plain", "--record", str(recording)) as bootstrap:
        assert produce(bootstrap, topic, MESSAGES) == MESSAGES
        for transactional_id in ids.values():
            produce_transaction(bootstrap, topic, transactional_id, 5, timeout=60)
        expected = MESSAGES + 5 * len(ids)
        for node, group in sorted(groups.items()):
            result = consume_group(bootstrap, group, topic, expected, timeout=60,
                                   dedupe_by_offset=True)  # fmt: skip
            distinct = len(set(result.values))
            assert (distinct, result.coordinator_errors) == (expected, []), (
                node, result.errors[:3])  # fmt: skip
    code, verdicts, said = verify(recording, "--strict")
    assert code == 0, said
    assert {key: verdicts.get(key) for key in [*groups.values(), *ids.values()]} == dict.fromkeys(
        [*groups.values(), *ids.values()], "ok"
    ), verdicts


def test_one_forward_meets_not_coordinator_and_verify_names_the_misrouted(
    apache_kafka_3: ApacheKafka, tmp_path: Path
) -> None:
    """The workaround (one forward to kafka-0, every broker name in the hosts file),
    captured with tcpdump: broker 0's group and transactional id work; the others meet
    NOT_COORDINATOR and fail, and verify names them misrouted."""
    topic = one_partition_led_by_broker_0(apache_kafka_3)
    groups, ids = spread(apache_kafka_3, topic)
    inside = [*WORKLOAD, "produce", apache_kafka_3.bootstrap(), topic, str(MESSAGES)]
    produced = subprocess.run(  # from inside the cluster, as another pod would
        apache_kafka_3.inside(inside), capture_output=True, text=True, timeout=120
    )
    assert produced.stdout.strip() == f"PRODUCED {MESSAGES}", produced.stderr[-2000:]
    only_broker_0s_work_through_one_forward(
        apache_kafka_3, tmp_path / "one-forward.pcap", topic, groups, ids, MESSAGES
    )
