"""Apache Kafka itself behind `kafkatunnel up`: three KRaft nodes from Maven Central
(tests/worlds/apache.py) advertising Kubernetes names in a network of their
own, with Strimzi's plain, TLS, SCRAM-over-TLS and mutual-TLS listeners. The cluster is
started once for this package's tests (the `apache_kafka` fixture) and shared."""

from __future__ import annotations

import re
import struct
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader

from kafkatunnel.capture.packets import ACK, SYN, Capture
from kafkatunnel.demo import free_port_run
from kafkatunnel.demo.apache import HEAP, KAFKA_3_VERSION, KAFKA_VERSION
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.demo.workload import consume_group, consume_groups, produce
from kafkatunnel.probe import ProbeConnection
from kafkatunnel.waiting import wait_for
from tests.apache.pods import CONNECT_VERSION
from tests.worlds.apache import SCRAM_PASSWORD, SCRAM_USER, ApacheKafka

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 30


@contextmanager
def tunnel_process(
    kafka: ApacheKafka, listener: str = "plain", *flags: str
) -> Iterator[tuple[str, ManagedProcess]]:
    """`kafkatunnel up` in front of one of the cluster's listeners, through forwards into
    its network; yields the bootstrap.servers it prints, and the process (its output)."""
    up = ManagedProcess(
        [sys.executable, "-m", "kafkatunnel", "up", "--no-table",
         "--bootstrap", kafka.bootstrap(listener), "--exec", kafka.exec_template(),
         "--listen", f"127.0.0.1:{free_port_run(8)}", *flags],
        name=f"kafkatunnel-up-apache-{listener}",
    )  # fmt: skip
    try:
        yield up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=60).group(1), up
    finally:
        up.stop()


@contextmanager
def tunnel(kafka: ApacheKafka, listener: str = "plain", *flags: str) -> Iterator[str]:
    """tunnel_process's bootstrap.servers alone."""
    with tunnel_process(kafka, listener, *flags) as (bootstrap, _up):
        yield bootstrap


def tls_flags(kafka: ApacheKafka) -> list[str]:
    assert kafka.credentials is not None
    return ["--tls", "--tls-ca", str(kafka.credentials.cluster_ca)]


CONSUMER_GROUP_HEARTBEAT, SHARE_GROUP_HEARTBEAT, STREAMS_GROUP_HEARTBEAT = 68, 76, 88


def test_every_kind_of_group_is_offered_through_the_tunnel(apache_kafka: ApacheKafka) -> None:
    """The cluster runs with Kafka 4.4's group features as a new cluster gets them: share
    groups (KIP-932) and streams groups (KIP-1071, `group.protocol=streams`) finalized, and
    their heartbeats offered, beside KIP-848's, to clients through the tunnel."""
    describe = ["--bootstrap-server", apache_kafka.bootstrap(), "describe"]
    features = apache_kafka.tool("org.apache.kafka.tools.FeatureCommand", *describe)
    finalized = dict(re.findall(r"Feature: (\S+)\s.*?FinalizedVersionLevel: (\d+)", features))
    groups = ("group.version", "share.version", "streams.version")
    assert {f: finalized.get(f) for f in groups} == {
        "group.version": "1", "share.version": "2", "streams.version": "1"}, features  # fmt: skip
    with tunnel(apache_kafka) as bootstrap, ProbeConnection(bootstrap.split(",")[0]) as probe:
        offered = probe.api_versions()
    heartbeats = (CONSUMER_GROUP_HEARTBEAT, SHARE_GROUP_HEARTBEAT, STREAMS_GROUP_HEARTBEAT)
    assert [key for key in heartbeats if key not in offered] == [], offered


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_groups_on_every_coordinator_through_the_tunnel(
    apache_kafka: ApacheKafka, protocol: str
) -> None:
    """The field report's failure, on Apache Kafka: a group per coordinator consumes every
    message without NOT_COORDINATOR, with the classic protocol and with KIP-848's."""
    topic = f"apache-{protocol}-{uuid.uuid4().hex[:6]}"
    spread = apache_kafka.groups_by_coordinator(1, prefix=f"{topic}-g")
    assert sorted(spread) == [0, 1, 2]
    with tunnel(apache_kafka) as bootstrap:
        assert produce(bootstrap, topic, MESSAGES) == MESSAGES
        config = {"group.protocol": protocol}
        for node, (group,) in sorted(spread.items()):
            result = consume_group(bootstrap, group, topic, MESSAGES, timeout=60, config=config,
                                   dedupe_by_offset=True)  # fmt: skip
            distinct = len(set(result.values))
            assert (distinct, result.coordinator_errors) == (MESSAGES, []), (
                node, result.errors[:3])  # fmt: skip


def test_transactions_on_every_coordinator_commit_and_abort(apache_kafka: ApacheKafka) -> None:
    with tunnel(apache_kafka) as bootstrap:
        commit_and_abort_on_every_coordinator(apache_kafka, bootstrap, "apache-txn")


def commit_and_abort_on_every_coordinator(kafka: ApacheKafka, bootstrap: str, prefix: str) -> None:
    """A transactional id per transaction coordinator (librdkafka with no setting but
    bootstrap.servers and transactional.id): one transaction committed and one aborted
    each; a read_committed group sees exactly the committed records."""
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    spread = kafka.groups_by_coordinator(1, prefix=f"{topic}-t", transactional=True)
    assert sorted(spread) == [0, 1, 2]
    for (transactional_id,) in spread.values():
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": transactional_id}
        )
        producer.init_transactions(60)
        for outcome in ("commit", "abort"):
            producer.begin_transaction()
            for index in range(5):
                producer.produce(topic, f"{transactional_id}-{outcome}-{index}".encode())
            if outcome == "commit":
                producer.commit_transaction(60)
            else:
                producer.abort_transaction(60)
    committed = consume_group(bootstrap, f"{topic}-rc", topic, 15, timeout=60,
                              config={"isolation.level": "read_committed"})  # fmt: skip
    assert committed.consumed == 15 and committed.coordinator_errors == []
    assert all(b"-commit-" in value for value in committed.values), committed.values


def test_kafkas_own_tools_through_the_tunnel(apache_kafka: ApacheKafka) -> None:
    """kafka-topics and kafka-consumer-groups (their kafka-tools main classes, run with the
    cached jars) create, describe and list through the tunnel's bootstrap alone."""
    topic = f"apache-tools-{uuid.uuid4().hex[:6]}"

    def tool(main_class: str, *args: str) -> str:
        argv = ["java", *HEAP, "-cp", f"{apache_kafka.lib}/*", main_class, *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    with tunnel(apache_kafka) as bootstrap:
        server = ["--bootstrap-server", bootstrap]
        tool("org.apache.kafka.tools.TopicCommand", *server, "--create", "--topic", topic,
             "--partitions", "6", "--replication-factor", "3")  # fmt: skip
        described = tool("org.apache.kafka.tools.TopicCommand", *server, "--describe",
                         "--topic", topic)  # fmt: skip
        assert len(re.findall(rf"Topic: {topic}\s+Partition: \d", described)) == 6, described
        assert produce(bootstrap, topic, MESSAGES) == MESSAGES
        group = f"{topic}-g"
        assert consume_group(bootstrap, group, topic, MESSAGES, timeout=60).consumed == MESSAGES
        groups = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
        assert group in tool(groups, *server, "--list").split()
        offsets = tool(groups, *server, "--describe", "--group", group)
        assert sum(int(row.split()[4]) for row in offsets.splitlines()
                   if row.startswith(group)) == MESSAGES, offsets  # fmt: skip


def test_scram_over_tls_logs_in_through_the_tunnel_and_a_wrong_password_fails_as_kafka_says(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    """SCRAM-SHA-512 over TLS, Strimzi's `scram-sha-512` listener: the tunnel speaks TLS to
    the brokers (verifying their advertised names), the client SASL in plaintext to the
    tunnel. alice logs in and consumes; a wrong password gets Kafka's own message; the
    recording holds the SCRAM connections, but neither the password nor the SCRAM
    exchange."""
    recordings = tmp_path / "recordings"
    scram = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
             "sasl.username": SCRAM_USER, "sasl.password": SCRAM_PASSWORD}  # fmt: skip
    topic = f"apache-scram-{uuid.uuid4().hex[:6]}"
    flags = [*tls_flags(apache_kafka), "--record", str(recordings)]
    with tunnel(apache_kafka, "scram", *flags) as bootstrap:
        assert produce(bootstrap, topic, MESSAGES, config=scram) == MESSAGES
        result = consume_group(bootstrap, f"{topic}-g", topic, MESSAGES, timeout=60,
                               config=scram)  # fmt: skip
        assert result.consumed == MESSAGES, result.errors[:3]
        said = refused_login(bootstrap, {**scram, "sasl.password": "not-the-password"})
    assert "Authentication failed during authentication due to invalid credentials with " \
        "SASL mechanism SCRAM-SHA-512" in said, said  # fmt: skip
    recorded = b"".join(path.read_bytes() for path in recordings.iterdir())
    for secret in (SCRAM_PASSWORD.encode(), b"not-the-password", b"n=alice,r=", b"c=biws"):
        assert secret not in recorded, secret
    # The SASL connections were recorded, redacted, not dropped: read back with Kafka's
    # own schemas (kio), one logs in with SCRAM-SHA-512 and produces to the topic, and no
    # SaslAuthenticate either way keeps its bytes (the SCRAM messages and proofs).
    connections = recorded_messages(recordings)
    logged_in = [
        messages for messages in connections.values()
        if any(m.__api_key__ == SASL_HANDSHAKE and m.mechanism == "SCRAM-SHA-512"
               for m, _ in messages)
    ]  # fmt: skip
    assert any(
        m.__api_key__ == PRODUCE and topic in (t.name for t in m.topic_data)
        for messages in logged_in for m, _ in messages
    ), f"no Produce to {topic} on a SCRAM connection in {len(connections)} recorded"  # fmt: skip
    authenticate = [(m, answer) for messages in logged_in for m, answer in messages
                    if m.__api_key__ == SASL_AUTHENTICATE]  # fmt: skip
    assert authenticate, "no SaslAuthenticate recorded"
    for request, answer in authenticate:
        assert request.auth_bytes == b"" and answer is not None and answer.auth_bytes == b""


Connection = tuple[str, int, str, int]  # the client's address and port, the tunnel's
SASL_HANDSHAKE, SASL_AUTHENTICATE, PRODUCE = 17, 36, 0


def recorded_messages(recordings: Path) -> dict[Connection, list[tuple[Any, Any]]]:
    """Each recorded connection's SaslHandshake, SaslAuthenticate and Produce requests with
    their answers (None: none recorded), decoded by kio from Kafka's own schemas, not by
    the tunnel's code: the recording as a reader of it sees it."""
    streams: dict[Connection, bytearray] = {}
    listeners: set[int] = set()
    for path in sorted(recordings.iterdir()):
        for segment in Capture(path.read_bytes()).segments():
            if segment.flags & SYN and not segment.flags & ACK:
                listeners.add(segment.dport)
            flow = (segment.src, segment.sport, segment.dst, segment.dport)
            streams.setdefault(flow, bytearray()).extend(segment.payload)
    connections = {}
    for (client, client_port, server, port), sent in streams.items():
        if port not in listeners:
            continue
        received = streams.get((server, port, client, client_port), b"")
        answers = {int.from_bytes(f[:4], "big", signed=True): f for f in _frames(received)}
        messages = []
        for frame in _frames(sent):
            key, version, correlation = struct.unpack_from(">hhi", frame)
            if key not in (SASL_HANDSHAKE, SASL_AUTHENTICATE, PRODUCE):
                continue
            request = _decoded(load_request_schema(key, version), frame)
            answer = answers.get(correlation)
            if answer is not None:
                answer = _decoded(load_response_schema(key, version), answer)
            messages.append((request, answer))
        connections[(client, client_port, server, port)] = messages
    return connections


def _frames(data: bytes | bytearray) -> list[bytes]:
    frames, pos = [], 0
    while pos < len(data):
        end = pos + 4 + int.from_bytes(data[pos : pos + 4], "big")
        assert end <= len(data), "a frame cut short in the recording"
        frames.append(bytes(data[pos + 4 : end]))
        pos = end
    return frames


def _decoded(schema: Any, frame: bytes) -> Any:
    """The message in a frame (after its size), which must fill it exactly."""
    _header, offset = entity_reader(schema.__header_schema__)(frame, 0)
    message, size = entity_reader(schema)(frame, offset)
    assert offset + size == len(frame), (schema, frame[:64])
    return message


def refused_login(bootstrap: str, config: dict[str, Any]) -> str:
    """What a client is told when its login fails (the error callback's first error)."""
    errors: list[str] = []
    failed = threading.Event()

    def on_error(error: confluent_kafka.KafkaError) -> None:
        errors.append(str(error))
        if error.code() == confluent_kafka.KafkaError._AUTHENTICATION:
            failed.set()

    producer = confluent_kafka.Producer({**config, "bootstrap.servers": bootstrap,
                                         "error_cb": on_error})  # fmt: skip

    def seen() -> bool:
        producer.poll(0.2)
        return failed.is_set()

    wait_for(seen, timeout=30, what="the login to be refused")
    return " | ".join(errors)


def test_mutual_tls_logs_in_with_the_users_certificate(apache_kafka: ApacheKafka) -> None:
    """Strimzi's `tls` authentication: the listener requires a certificate from the clients
    CA; the tunnel presents the user's (--tls-cert/--tls-key) and clients need nothing."""
    assert apache_kafka.credentials is not None
    user = apache_kafka.credentials.mtls_user
    topic = f"apache-mtls-{uuid.uuid4().hex[:6]}"
    flags = [*tls_flags(apache_kafka), "--tls-cert", str(user.cert), "--tls-key", str(user.key)]
    with tunnel(apache_kafka, "mtls", *flags) as bootstrap:
        assert produce(bootstrap, topic, MESSAGES) == MESSAGES
        groups = {gs[0]: MESSAGES for gs in
                  apache_kafka.groups_by_coordinator(1, prefix=f"{topic}-g").values()}  # fmt: skip
        for group, result in consume_groups(bootstrap, groups, topic, timeout=60).items():
            assert (result.consumed, result.coordinator_errors) == (MESSAGES, []), group


def test_mutual_tls_without_a_certificate_says_the_listener_requires_one(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    """`up --tls` on Strimzi's mTLS listener with no client certificate: Kafka (Java) ends
    TLS with "bad certificate", and up says the listener requires a client certificate and
    the three ways to give one, not that a --tls-cert nobody gave was refused."""
    result = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "up", "--no-table",
         "--bootstrap", apache_kafka.bootstrap("mtls"), "--exec", apache_kafka.exec_template(),
         "--listen", f"127.0.0.1:{free_port_run(8)}", *tls_flags(apache_kafka)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and "Traceback" not in said, said
    assert "bad certificate" in said, said  # what Kafka itself answered
    assert "the listener requires a client certificate (mTLS) and the tunnel presented none: " \
        "give --tls-cert FILE with --tls-key FILE, or --tls-pkcs12 FILE, or with --via " \
        "kubectl --kafka-user NAME" in said, said  # fmt: skip
    assert "refused the certificate of" not in said, said


def test_a_sasl_listener_is_said_to_want_a_login_before_its_brokers_are_listed(
    apache_kafka: ApacheKafka,
) -> None:
    """Strimzi's scram-sha-512 listener answers nothing but a login before the tunnel can
    list its brokers: up says so, with the mechanism Kafka names, and that the brokers come
    once a client has logged in: then one does, and its group's coordinator, not the
    bootstrap broker, is reached through the tunnel."""
    up = ManagedProcess(
        [sys.executable, "-m", "kafkatunnel", "up", "--no-table",
         "--bootstrap", apache_kafka.bootstrap("scram"), "--exec", apache_kafka.exec_template(),
         "--listen", f"127.0.0.1:{free_port_run(8)}", *tls_flags(apache_kafka)],
        name="kafkatunnel-up-apache-scram-login",
    )  # fmt: skip
    try:
        bootstrap = up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=60).group(1)
        said = " ".join(up.output().split())
        assert "the bootstrap broker's listener wants a login (SASL SCRAM-SHA-512) before it " \
            "lists the brokers: they are added when a client has logged in through the " \
            "tunnel (clients set security.protocol=SASL_PLAINTEXT, " \
            "sasl.mechanism=SCRAM-SHA-512)" in said, said  # fmt: skip
        assert "could not list the brokers" not in said, said
        scram = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                 "sasl.username": SCRAM_USER, "sasl.password": SCRAM_PASSWORD}  # fmt: skip
        topic = f"apache-login-{uuid.uuid4().hex[:6]}"
        assert produce(bootstrap, topic, MESSAGES, config=scram) == MESSAGES
        (group,) = apache_kafka.groups_by_coordinator(1, prefix=f"{topic}-g")[2]  # not node 0
        result = consume_group(bootstrap, group, topic, MESSAGES, timeout=60, config=scram)
        assert (result.consumed, result.coordinator_errors) == (MESSAGES, []), result.errors[:3]
    finally:
        up.stop()


def test_each_brokers_own_log_reaches_its_output(apache_kafka: ApacheKafka) -> None:
    """Kafka logs through SLF4J: without the binding its release ships (and its pom does not
    name), every line is dropped, a broker that cannot start says nothing, and a pod's log
    is SLF4J's warning alone. Each node's output has its KafkaRaftServer's start, and the
    steps of its broker's start-up that say where one waits (kafkatunnel.demo.apache's
    LOG4J names Kafka 4.4's loggers: a renamed one logs nothing and fails here)."""
    steps = [r"KafkaRaftServer nodeId={node}\] Kafka Server started",
             r"The broker has caught up\. Transitioning from STARTING to RECOVERY",
             r"The broker has been unfenced\. Transitioning from RECOVERY to RUNNING",
             r"\(kafka\.server\.BrokerServer\)",
             r"\(org\.apache\.kafka\.raft\.QuorumState\)"]  # fmt: skip
    for node, process in enumerate(apache_kafka.processes):
        output = process.output()
        assert "NOP" not in output, output[-2000:]
        for step in steps:
            assert re.search(step.format(node=node), output), (step, output[-2000:])


def test_the_fetched_version_is_the_one_the_cluster_runs() -> None:
    """scripts/apache-kafka/pom.xml (what the set-up fetches) is the one place a version is
    changed, scripts/kafka-connect/pom.xml Connect's: the constants and the docs that name
    the versions agree with them."""
    pom = (ROOT / "scripts" / "apache-kafka" / "pom.xml").read_text()
    fetched = {name: re.search(rf"<{name}>([^<]+)</{name}>", pom) for name in
               ("kafka.version", "kafka3.version")}  # fmt: skip
    assert {k: m and m[1] for k, m in fetched.items()} == {
        "kafka.version": KAFKA_VERSION, "kafka3.version": KAFKA_3_VERSION}  # fmt: skip
    connect = (ROOT / "scripts" / "kafka-connect" / "pom.xml").read_text()
    assert f"<connect.version>{CONNECT_VERSION}</connect.version>" in connect
    named = {
        "README.md": [f"Apache Kafka {KAFKA_VERSION}", f"Kafka Connect {CONNECT_VERSION}",
                      KAFKA_3_VERSION],
        "docs/clients.md": [f"Apache Kafka {KAFKA_VERSION} from Maven Central",
                            f"Apache Kafka {KAFKA_3_VERSION}, the last 3.x"],
        "docs/companions.md": [f"beside Apache Kafka {KAFKA_VERSION}", f"| {CONNECT_VERSION} ("],
    }  # fmt: skip
    for doc, phrases in named.items():
        text = " ".join((ROOT / doc).read_text().split())
        assert [p for p in phrases if p not in text] == [], doc
