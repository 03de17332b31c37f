"""`kafkatunnel up --read-only` in front of Apache Kafka: Kafka's own tools and clients read
and consume as ever, and everything that would change the cluster fails with the client's
ordinary authorization error, while the cluster, looked at directly, did not change. One
tunnel serves every test here."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.schema.metadata.v12.request import MetadataRequestTopic
from kio.serial import entity_reader

from kafkatunnel.demo import free_port_run
from kafkatunnel.demo.apache import HEAP
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.probe import ProbeConnection, encode_request
from kafkatunnel.protocol import (
    FrameDecoder,
    authorization_error,
    response_body_offset,
    response_correlation_id,
)
from kafkatunnel.waiting import wait_for
from tests.apache.test_clients import DEADLINE, MESSAGES, java, javascript, js_client
from tests.protocol.requests_built import built, error_fields
from tests.protocol.test_guarded_passage import CHANGING
from tests.worlds.apache import ApacheKafka

__all__ = ["js_client"]  # a fixture, used by name
DENIED = "Authorization failed"
GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"


@pytest.fixture(scope="module")
def guarded(apache_kafka: ApacheKafka) -> Iterator[tuple[str, ManagedProcess]]:
    """`up --read-only` (as tests.apache.test_apache_kafka.tunnel starts `up`), and its
    process, whose log the tests read."""
    up = ManagedProcess(
        [sys.executable, "-m", "kafkatunnel", "up", "--no-table", "--read-only",
         "--bootstrap", apache_kafka.bootstrap(), "--exec", apache_kafka.exec_template(),
         "--listen", f"127.0.0.1:{free_port_run(8)}"],
        name="kafkatunnel-up-read-only",
    )  # fmt: skip
    try:
        yield up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=60).group(1), up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def through(guarded: tuple[str, ManagedProcess]) -> str:
    return guarded[0]


@pytest.fixture(scope="module")
def topic(apache_kafka: ApacheKafka, java_classes: str) -> str:
    """A topic with MESSAGES records, made and filled directly, not through the tunnel."""
    name = f"guarded-{uuid.uuid4().hex[:6]}"
    apache_kafka.tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                      apache_kafka.bootstrap(), "--create", "--topic", name,
                      "--partitions", "3", "--replication-factor", "3")  # fmt: skip
    client = ["java", "-Xmx256m", "-cp", java_classes, "JavaClient", "produce"]
    produce = apache_kafka.inside([*client, apache_kafka.bootstrap(), name, str(MESSAGES)])
    result = subprocess.run(produce, capture_output=True, text=True, timeout=DEADLINE)
    assert f"PRODUCED {MESSAGES}" in result.stdout, result.stderr[-2000:]
    return name


def _tool(kafka: ApacheKafka, main_class: str, *args: str) -> subprocess.CompletedProcess[str]:
    """One of Kafka's tools on this machine, through the tunnel (the bootstrap in args)."""
    argv = ["java", *HEAP, "-cp", f"{kafka.lib}/*", main_class, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE)


def _offsets(kafka: ApacheKafka, topic: str) -> str:
    """The topic's end offsets, asked directly."""
    return kafka.tool("org.apache.kafka.tools.GetOffsetShell", "--bootstrap-server",
                      kafka.bootstrap(), "--topic", topic)  # fmt: skip


def test_kafka_topics_describes_and_cannot_delete(
    apache_kafka: ApacheKafka, through: str, topic: str
) -> None:
    topics = "org.apache.kafka.tools.TopicCommand"
    described = _tool(apache_kafka, topics, "--bootstrap-server", through, "--describe",
                      "--topic", topic)  # fmt: skip
    assert described.returncode == 0 and f"Topic: {topic}" in described.stdout, described

    deleted = _tool(apache_kafka, topics, "--bootstrap-server", through, "--delete",
                    "--topic", topic)  # fmt: skip
    assert deleted.returncode != 0
    assert DENIED in deleted.stdout + deleted.stderr, deleted.stdout + deleted.stderr[-2000:]
    still = apache_kafka.tool(topics, "--bootstrap-server", apache_kafka.bootstrap(), "--list")
    assert topic in still.split()


def test_a_metadata_request_creates_no_topic(apache_kafka: ApacheKafka, through: str) -> None:
    """The broker creates topics a Metadata request names (auto.create.topics.enable, on by
    default) when the request lets it: through read-only, it does not let it."""
    missing = f"guarded-missing-{uuid.uuid4().hex[:6]}"
    request_type: Any = load_request_schema(3, 12)
    named: Any = MetadataRequestTopic(topic_id=None, name=missing)  # type: ignore[arg-type]
    asked = request_type(topics=(named,),
                         allow_auto_topic_creation=True,
                         include_topic_authorized_operations=False)  # fmt: skip
    with ProbeConnection(through.split(",")[0]) as probe:
        answer = probe.request(asked)
    assert [t.error_code for t in answer.topics] == [ErrorCode.unknown_topic_or_partition]
    listed = apache_kafka.tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                               apache_kafka.bootstrap(), "--list")  # fmt: skip
    assert missing not in listed.split()


def test_refusals_are_counted_in_status_and_metrics_and_logged_once(
    apache_kafka: ApacheKafka, guarded: tuple[str, ManagedProcess], topic: str
) -> None:
    through, up = guarded
    before = _refused(through)
    for _ in range(2):  # the same client id (adminclient-1) both times
        deleted = _tool(apache_kafka, "org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                        through, "--delete", "--topic", topic)  # fmt: skip
        assert deleted.returncode != 0
    counted = _refused(through)
    assert counted["DeleteTopics"] - before["DeleteTopics"] == 2, counted
    said = re.findall(r"refused DeleteTopics from client '([^']*)'", up.output())
    assert said and len(said) == len(set(said)), said  # once per client id
    status = _status(through)
    assert status["policy"]["read_only"] is True
    assert status["policy"]["refused"] == sum(counted.values())
    control = status["control"].removeprefix("unix:")
    metrics = subprocess.run(["curl", "-s", "--unix-socket", control,
                              "http://kafkatunnel/metrics"], capture_output=True, text=True,
                             check=True, timeout=30).stdout  # fmt: skip
    deletes = re.findall(r'^kafkatunnel_api_refused_total\{.*api="DeleteTopics"\} (\d+)$',
                         metrics, re.M)  # fmt: skip
    assert sum(int(n) for n in deletes) == counted["DeleteTopics"], metrics


def _status(bootstrap: str) -> dict[str, Any]:
    port = bootstrap.split(",")[0].rsplit(":", 1)[1]
    status = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "status", "--json", "--port", port],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return dict(json.loads(status.stdout))


def _refused(bootstrap: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for endpoint in _status(bootstrap)["endpoints"]:
        counts.update(endpoint["api_refused"])
    return counts


def test_the_java_producer_fails_with_its_authorization_error_and_nothing_is_written(
    apache_kafka: ApacheKafka, through: str, topic: str, java_classes: str
) -> None:
    before = _offsets(apache_kafka, topic)
    argv = ["java", "-Xmx256m", "-cp", java_classes, "JavaClient", "produce", through, topic, "5"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE)
    assert result.returncode != 0
    assert "TopicAuthorizationException" in result.stderr, result.stderr[-2000:]
    assert _offsets(apache_kafka, topic) == before


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_consumers_on_every_coordinator_consume_and_commit(
    apache_kafka: ApacheKafka, through: str, topic: str, java_classes: str, protocol: str
) -> None:
    """Their own commits pass (JavaClient commits synchronously before it says CONSUMED),
    and are there when asked directly."""
    _, consume = java(java_classes, protocol)
    spread = apache_kafka.groups_by_coordinator(1, prefix=f"{topic}-{protocol}")
    assert sorted(spread) == [0, 1, 2]
    for _node, (group,) in sorted(spread.items()):
        assert consume(through, topic, group, MESSAGES) == MESSAGES
        groups = apache_kafka.tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                                   "--bootstrap-server", apache_kafka.bootstrap(), "--describe",
                                   "--group", group)  # fmt: skip
        committed = [int(n) for n in re.findall(rf"{topic}\s+\d+\s+(\d+)", groups)]
        assert sum(committed) == MESSAGES, groups


def test_resetting_another_groups_offsets_is_refused(
    apache_kafka: ApacheKafka, through: str, topic: str, java_classes: str
) -> None:
    group = f"{topic}-reset"
    _, consume = java(java_classes, "classic")
    assert consume(through, topic, group, MESSAGES) == MESSAGES  # its own commits pass
    command = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
    direct = ["--bootstrap-server", apache_kafka.bootstrap(), "--describe", "--group", group]
    before = apache_kafka.tool(command, *direct)
    reset = _tool(apache_kafka, command, "--bootstrap-server", through, "--reset-offsets",
                  "--group", group, "--topic", topic, "--to-earliest", "--execute")  # fmt: skip
    said = reset.stdout + reset.stderr
    assert "GroupAuthorizationException" in said or DENIED in said, said[-2000:]
    assert apache_kafka.tool(command, *direct) == before


def test_transactions_are_refused(apache_kafka: ApacheKafka, through: str, topic: str) -> None:
    before = _offsets(apache_kafka, topic)
    result = _tool(apache_kafka, "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
                   "--num-records", "5", "--record-size", "10", "--throughput", "-1",
                   "--transactional-id", f"{topic}-tx", "--transaction-duration-ms", "100",
                   "--producer-props", f"bootstrap.servers={through}")  # fmt: skip
    said = result.stdout + result.stderr
    assert "TransactionalIdAuthorizationException" in said, said[-2000:]
    assert _offsets(apache_kafka, topic) == before


def test_librdkafka_sees_the_same(apache_kafka: ApacheKafka, through: str, topic: str) -> None:
    before = _offsets(apache_kafka, topic)
    errors: list[confluent_kafka.KafkaError | None] = []
    producer = confluent_kafka.Producer({"bootstrap.servers": through, "acks": "all"})
    for i in range(3):
        producer.produce(topic, f"rdkafka-{i}".encode(),
                         on_delivery=lambda error, _: errors.append(error))  # fmt: skip
    assert producer.flush(60) == 0
    refused = confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert [None if e is None else e.code() for e in errors] == [refused] * 3
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": through})
    deleting = admin.delete_topics([topic], operation_timeout=30)[topic]
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        deleting.result(60)
    assert raised.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _offsets(apache_kafka, topic) == before


@pytest.mark.parametrize("library", ["kafkajs", "platformatic"])
def test_the_javascript_clients_see_the_same(
    apache_kafka: ApacheKafka, through: str, topic: str, js_client: str, library: str
) -> None:
    before = _offsets(apache_kafka, topic)
    _, consume = javascript(js_client, library)
    argv = ["node", js_client, library, "produce", through, topic, "3"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE)
    said = result.stdout + result.stderr
    assert result.returncode != 0 and re.search("not authorized|authorization", said, re.I), said
    assert _offsets(apache_kafka, topic) == before
    assert consume(through, topic, f"{topic}-{library}", MESSAGES) == MESSAGES


NAMES_A_TOPIC = ("name", "topic", "topic_name", "resource_name")


def _aimed(request: Any, topic: str, group: str) -> Any:
    """The request with every topic, group and transactional id it names made real ones, so
    that were it let through, it would change them."""

    def aim(value: Any) -> Any:
        if isinstance(value, tuple):
            return tuple(aim(v) for v in value)
        if not dataclasses.is_dataclass(value) or isinstance(value, type):
            return value
        changes: dict[str, Any] = {}
        for field in dataclasses.fields(value):
            inner = getattr(value, field.name)
            if field.name in NAMES_A_TOPIC and isinstance(inner, str):
                changes[field.name] = topic
            elif field.name in ("group_id",) and isinstance(inner, str):
                changes[field.name] = group
            elif field.name in ("topic_names",):
                changes[field.name] = (topic,)
            elif field.name in ("groups_names",):
                changes[field.name] = (group,)
            elif field.name == "partitions" and all(isinstance(p, int) for p in inner or ()):
                changes[field.name] = (0,)
            elif field.name in ("partition_index", "index", "partition"):
                changes[field.name] = 0
            else:
                changes[field.name] = aim(inner)
        return dataclasses.replace(value, **changes)

    return aim(request)


def test_no_request_that_changes_the_cluster_passes_at_any_version_it_offers(
    apache_kafka: ApacheKafka, through: str, topic: str, java_classes: str
) -> None:
    """Every API that changes the cluster (the issue's list, not the tunnel's), at every
    version the cluster offers (and kio knows), aimed at a real topic and group, answered
    by the tunnel with the API's authorization error; the cluster's topics, the topic's
    offsets and configs and the group's offsets unchanged."""
    group = f"{topic}-aimed"
    _, consume = java(java_classes, "classic")
    assert consume(through, topic, group, MESSAGES) == MESSAGES
    state = _state(apache_kafka, topic, group)
    host, port = through.split(",")[0].rsplit(":", 1)
    with ProbeConnection(through.split(",")[0]) as probe:
        offered = probe.api_versions()
    sent: list[tuple[int, int]] = []
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        decoder = FrameDecoder()
        correlation = 0
        for key in sorted(CHANGING & offered.keys()):
            low, high = offered[key]
            known = schema_name_map[api_key_map[key]]
            for version in (v for v in range(low, high + 1) if v in known):
                correlation += 1
                request = _aimed(built(key, version), topic, group)
                if key == 0:
                    request = dataclasses.replace(request, acks=-1)
                sock.sendall(encode_request(request, correlation))
                frames: list[bytes] = []
                while not frames:
                    chunk = sock.recv(65536)
                    assert chunk, f"the connection closed after API {key} v{version}"
                    frames = decoder.feed(chunk)
                answer = frames[0]
                assert response_correlation_id(answer) == correlation
                body = answer[response_body_offset(answer, key, version) :]
                value, _ = entity_reader(load_response_schema(key, version))(body, 0)
                codes = _error_codes(value)
                assert codes, (key, version)
                expected = {authorization_error(key)} | _config_errors(key)
                assert set(codes) <= expected, (key, version, codes)
                sent.append((key, version))
    assert {k for k, _ in sent} >= {0, 19, 20, 21, 37, 33, 44, 42, 47, 24, 26}, sent
    assert _state(apache_kafka, topic, group) == state


def _state(kafka: ApacheKafka, topic: str, group: str) -> tuple[str, ...]:
    """What a request let through would change, asked directly: the topic's offsets, the
    group's, every topic and its partitions, the topic's configs."""
    direct = ["--bootstrap-server", kafka.bootstrap(), "--describe"]
    configs = ["--entity-type", "topics", "--entity-name", topic]
    return (
        _offsets(kafka, topic),
        kafka.tool(GROUPS, *direct, "--group", group),
        kafka.tool("org.apache.kafka.tools.TopicCommand", *direct),
        kafka.tool("org.apache.kafka.tools.ConfigCommand", *direct, *configs),
    )


def _config_errors(key: int) -> set[ErrorCode]:
    if key in (33, 44):  # configs: by resource type
        return {ErrorCode.topic_authorization_failed, ErrorCode.cluster_authorization_failed}
    return set()


def _error_codes(value: Any) -> list[ErrorCode]:
    """Every error code in an answer (its error messages left out)."""
    return [code for name, code, _ in error_fields(value) if not name.endswith("error_message")]


def _coordinator(through: str, group: str) -> str:
    """The tunnel's address of the group's coordinator, asked through the tunnel."""
    asked = built(10, 4, key_type=0, coordinator_keys=(group,))
    with ProbeConnection(through.split(",")[0]) as probe:
        (found,) = probe.request(asked).coordinators
    assert found.error_code == ErrorCode.none, found
    return f"{found.host}:{found.port}"


def _members(kafka: ApacheKafka, group: str) -> list[str]:
    """The group's members' ids, asked directly (kafka-consumer-groups --members)."""
    listed = kafka.tool(GROUPS, "--bootstrap-server", kafka.bootstrap(), "--describe",
                        "--group", group, "--members")  # fmt: skip
    return sorted(line.split()[1] for line in listed.splitlines() if line.startswith(group))


def test_an_admin_commit_with_any_member_id_changes_no_offset(
    apache_kafka: ApacheKafka, through: str, topic: str, java_classes: str
) -> None:
    """Kafka takes a commit with generation -1 on an empty group whatever member id it
    names: through read-only, one naming member `x`, sent to the group's coordinator, is
    refused, and the group's offsets on the cluster stay as its consumer committed them."""
    group = f"{topic}-admin-commit"
    _, consume = java(java_classes, "classic")
    assert consume(through, topic, group, MESSAGES) == MESSAGES
    direct = ["--bootstrap-server", apache_kafka.bootstrap(), "--describe", "--group", group]
    before = apache_kafka.tool(GROUPS, *direct)
    for version in (8, 9):
        commit = _aimed(built(8, version, member_id="x", generation_id_or_member_epoch=-1),
                        topic, group)  # fmt: skip
        with ProbeConnection(_coordinator(through, group)) as probe:
            answer = probe.request(commit)
        codes = {p.error_code for t in answer.topics for p in t.partitions}
        assert codes == {ErrorCode.group_authorization_failed}, answer
    assert apache_kafka.tool(GROUPS, *direct) == before


def test_an_admin_leave_group_naming_a_live_member_removes_nobody(
    apache_kafka: ApacheKafka, through: str, topic: str
) -> None:
    """A LeaveGroup naming a member of a running application (as Admin's
    removeMembersFromConsumerGroup sends it), through read-only, to the group's
    coordinator: refused, and the member is still there, asked directly."""
    group = f"{topic}-members"
    consumer = confluent_kafka.Consumer({  # its own membership passes read-only
        "bootstrap.servers": through, "group.id": group,
        "group.instance.id": f"{group}-static", "auto.offset.reset": "earliest",
    })  # fmt: skip
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            consumer.poll(0.2)

    consumer.subscribe([topic])
    poller = threading.Thread(target=poll)
    poller.start()
    try:
        members = wait_for(lambda: _members(apache_kafka, group) or None, timeout=DEADLINE,
                           what=f"a member in group {group}")  # fmt: skip
        coordinator = _coordinator(through, group)
        for version in (3, 5):
            leave = built(13, version).members[0]
            removing = (
                dataclasses.replace(leave, member_id="", group_instance_id=f"{group}-static"),
                dataclasses.replace(leave, member_id=members[0], group_instance_id=None),
            )
            for one in removing:
                request = dataclasses.replace(built(13, version), group_id=group, members=(one,))
                with ProbeConnection(coordinator) as probe:
                    answer = probe.request(request)
                assert answer.error_code == ErrorCode.group_authorization_failed, answer
        assert _members(apache_kafka, group) == members
    finally:
        stop.set()
        poller.join(timeout=30)
        consumer.close()


@pytest.mark.parametrize("protocol", ["classic", "streams"])
def test_a_streams_application_stops_on_its_authorization_error_and_creates_no_topic(
    apache_kafka: ApacheKafka,
    through: str,
    topic: str,
    protocol: str,
    tmp_path: Path,
) -> None:
    """A Kafka Streams application through read-only: with the classic protocol it would
    create its internal topics with CreateTopics, with KIP-1071's the broker would create
    them from the topology in its heartbeat. Both are refused: Streams stops on its
    authorization error, and no topic of the application's is on the cluster."""
    from tests.apache.test_streams import RUNNING, Instance, streams_classpath_at

    application = f"{topic}-streams-{protocol}"
    instance = Instance(streams_classpath_at(tmp_path / "classes"), application, through,
                        application, topic, f"{application}-counts", protocol,
                        str(tmp_path / "state"))  # fmt: skip
    try:
        trouble = wait_for(instance.trouble, timeout=RUNNING,
                           what=f"Streams ({protocol}) to stop on its error")  # fmt: skip
    finally:
        instance.process.stop(timeout=45)
    assert re.search("Authorization|Could not create topic", trouble), trouble
    listed = apache_kafka.tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                               apache_kafka.bootstrap(), "--list")  # fmt: skip
    assert not [t for t in listed.split() if t.startswith(application)], listed


# Kafka's own tools, as a read-only user runs them: each answers through the tunnel as it
# does directly (addresses aside), so nothing a reader asks is refused. kafka-acls answers
# "security disabled" on this cluster (it has no authorizer) both ways: DescribeAcls passed.
READ_ONLY_TOOLS = {
    "kafka-topics --list": ("org.apache.kafka.tools.TopicCommand", "--list"),
    "kafka-topics --describe": ("org.apache.kafka.tools.TopicCommand", "--describe",
                                "--topic", "{topic}"),
    "kafka-consumer-groups --list": (GROUPS, "--list"),
    "kafka-consumer-groups --describe": (GROUPS, "--describe", "--group", "{topic}-tools",
                                         "--offsets"),
    "kafka-configs --describe topic": ("org.apache.kafka.tools.ConfigCommand", "--describe",
                                       "--entity-type", "topics", "--entity-name", "{topic}"),
    "kafka-configs --describe brokers": ("org.apache.kafka.tools.ConfigCommand", "--describe",
                                         "--entity-type", "brokers", "--all",
                                         "--entity-name", "1"),
    "kafka-configs --describe group": ("org.apache.kafka.tools.ConfigCommand", "--describe",
                                       "--entity-type", "groups", "--entity-name",
                                       "{topic}-tools"),
    "kafka-acls --list": ("org.apache.kafka.tools.AclCommand", "--list"),
    "kafka-share-groups --list": ("org.apache.kafka.tools.consumer.group.ShareGroupCommand",
                                  "--list"),
    "kafka-share-groups --describe": (
        "org.apache.kafka.tools.consumer.group.ShareGroupCommand", "--describe", "--group",
        "{topic}-share"),
    "kafka-features --describe": ("org.apache.kafka.tools.FeatureCommand", "describe"),
    "kafka-metadata-quorum --describe": ("org.apache.kafka.tools.MetadataQuorumCommand",
                                         "describe", "--status"),
}  # fmt: skip


def _said_plainly(text: str) -> str:
    """A tool's output without what differs between asking directly and through the
    tunnel, or from one moment to the next: broker addresses, client addresses, Java's
    stack frames, and the cluster's clocks (epochs, offsets, lags, timestamps)."""
    text = re.sub(r"\[?[\w.:-]+\]?:\d{2,5}\b", "ADDRESS", text)
    text = re.sub(r'("?\w*(?:epoch|highwatermark|timestamp|lag|offset)\w*"?:?\s*)-?\d+', r"\1N",
                  text, flags=re.IGNORECASE)  # fmt: skip
    text = re.sub(r"/\d+\.\d+\.\d+\.\d+", "/CLIENT", text)
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith("at "))


@pytest.fixture(scope="module")
def tool_groups(apache_kafka: ApacheKafka, topic: str, java_classes: str) -> str:
    """A consumer group whose member is gone and whose offsets are kept, made directly:
    what kafka-consumer-groups and kafka-configs describe."""
    group = f"{topic}-tools"
    client = ["java", "-Xmx256m", "-cp", java_classes, "JavaClient", "consume",
              apache_kafka.bootstrap(), topic, group, str(MESSAGES), "classic"]  # fmt: skip
    result = subprocess.run(apache_kafka.inside(client), capture_output=True, text=True,
                            timeout=DEADLINE)  # fmt: skip
    assert f"CONSUMED {MESSAGES}" in result.stdout, result.stderr[-2000:]
    return topic


@pytest.mark.parametrize("tool", list(READ_ONLY_TOOLS))
def test_every_read_only_tool_answers_as_it_does_directly(
    apache_kafka: ApacheKafka, through: str, tool_groups: str, tool: str
) -> None:
    main_class, *args = (a.format(topic=tool_groups) for a in READ_ONLY_TOOLS[tool])
    direct = subprocess.run(
        apache_kafka.inside(["java", *HEAP, "-cp", f"{apache_kafka.lib}/*", main_class,
                             "--bootstrap-server", apache_kafka.bootstrap(), *args]),
        capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    tunneled = _tool(apache_kafka, main_class, "--bootstrap-server", through, *args)
    said = tunneled.stdout + tunneled.stderr
    assert DENIED not in said and "uthorization" not in said, said[-3000:]
    assert tunneled.returncode == direct.returncode, (said[-3000:], direct.stderr[-2000:])
    # lines in any order: a listing's order is the brokers' answers', which vary
    assert sorted(_said_plainly(tunneled.stdout).splitlines()) == sorted(
        _said_plainly(direct.stdout).splitlines()), (tunneled.stdout, direct.stdout)  # fmt: skip


def test_a_share_consumer_reads_every_record_and_the_share_group_keeps_its_place(
    apache_kafka: ApacheKafka, through: str, topic: str, java_classes: str
) -> None:
    """KafkaShareConsumer (KIP-932) through read-only: its own membership, fetches and
    acknowledgements pass; it reads every record of the topic, set by the group's owner
    (directly) to start at the earliest."""
    group = f"{topic}-share"
    apache_kafka.tool("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server",
                      apache_kafka.bootstrap(), "--alter", "--entity-type", "groups",
                      "--entity-name", group,
                      "--add-config", "share.auto.offset.reset=earliest")  # fmt: skip
    share = ["java", *HEAP, "-cp", java_classes, "JavaClient", "share", through, topic, group,
             str(MESSAGES), "120"]  # fmt: skip
    result = subprocess.run(share, capture_output=True, text=True, timeout=DEADLINE + 120)
    assert f"CONSUMED {MESSAGES}" in result.stdout, result.stderr[-3000:]
