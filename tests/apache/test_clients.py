"""Clients in every language users write, each producing and consuming with a group on
every coordinator of Apache Kafka through one `kafkatunnel up`: the Java client (compiled
here with javac against the cached kafka-clients), librdkafka (kcat here; confluent-kafka
in test_apache_kafka), aiokafka, kafka-python, franz-go (Go module proxy) and kafkajs and
@platformatic/kafka (npm). docs/clients.md is the table these tests stand behind."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kafkatunnel.demo.apache import JIT
from kafkatunnel.protocol import api_title
from tests.apache.test_apache_kafka import tunnel
from tests.worlds.apache import ApacheKafka

CLIENTS = Path(__file__).resolve().parent / "clients"
MESSAGES = 20
# A client gives itself 60 s to consume and 30 s to commit; the test waits past both (and
# its start-up), so a slow client says what it got instead of being killed mid-commit.
DEADLINE = 60 + 30 + 30
CONSUMER_GROUP_HEARTBEAT, SHARE_GROUP_HEARTBEAT, SHARE_FETCH = 68, 76, 78

# A client: produce(bootstrap, topic, count) -> acknowledged; consume(bootstrap, topic,
# group, count) -> how many distinct values it consumed (and committed): a record
# delivered twice counts once.
Produce = Callable[[str, str, int], int]
Consume = Callable[[str, str, str, int], int]


@pytest.fixture(scope="module")
def through(apache_kafka: ApacheKafka) -> Iterator[str]:
    """One tunnel for every client of this module."""
    with tunnel(apache_kafka) as bootstrap:
        yield bootstrap


def api_requests(bootstrap: str) -> Counter[str]:
    """Requests per API that went through the tunnel so far, as `status --json` shows them
    (summed over its listeners)."""
    port = bootstrap.split(",")[0].rsplit(":", 1)[1]
    status = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "status", "--json", "--port", port],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    counts: Counter[str] = Counter()
    for endpoint in json.loads(status.stdout)["endpoints"]:
        counts.update(endpoint["api_requests"])
    return counts


def _said(argv: list[str], word: str, cwd: Path | None = None) -> int:
    """The count after `word` in a client program's output (PRODUCED n, CONSUMED n)."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE, cwd=cwd)
    for line in result.stdout.splitlines():
        if line.startswith(word + " "):
            return int(line.split()[1])
    raise AssertionError(
        f"{argv[0]} said no {word}: {result.stdout[-500:]} {result.stderr[-2000:]}"
    )


# -- the Java client ------------------------------------------------------------------------


def java(classpath: str, protocol: str) -> tuple[Produce, Consume]:
    base = ["java", "-Xmx256m", JIT, "-cp", classpath, "JavaClient"]
    return (
        lambda b, t, n: _said([*base, "produce", b, t, str(n)], "PRODUCED"),
        lambda b, t, g, n: _said([*base, "consume", b, t, g, str(n), protocol], "CONSUMED"),
    )


# -- librdkafka (kcat) ------------------------------------------------------------------------


def kcat_produce(bootstrap: str, topic: str, count: int) -> int:
    lines = "".join(f"kcat-{i}\n" for i in range(count))
    subprocess.run(["kcat", "-b", bootstrap, "-P", "-t", topic, "-X", "acks=all"],
                   input=lines, text=True, check=True, timeout=DEADLINE)  # fmt: skip
    return count  # kcat -P exits non-zero unless every message was delivered


def kcat_consume(bootstrap: str, topic: str, group: str, count: int) -> int:
    result = subprocess.run(
        ["kcat", "-q", "-b", bootstrap, "-G", group, "-o", "beginning", "-c", str(count), topic],
        capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert result.returncode == 0, f"kcat exited {result.returncode}: {result.stderr[-2000:]}"
    return len(set(result.stdout.splitlines()))


# -- Python, pure -----------------------------------------------------------------------------


def aiokafka_produce(bootstrap: str, topic: str, count: int) -> int:
    from aiokafka import AIOKafkaProducer

    async def run() -> int:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for i in range(count):
                await producer.send_and_wait(topic, f"aiokafka-{i}".encode())
        finally:
            await producer.stop()
        return count

    return asyncio.run(run())


def aiokafka_consume(bootstrap: str, topic: str, group: str, count: int) -> int:
    from aiokafka import AIOKafkaConsumer

    async def run() -> int:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, group_id=group,
            auto_offset_reset="earliest", enable_auto_commit=False,
        )  # fmt: skip
        await consumer.start()
        values: set[bytes] = set()
        deadline = time.monotonic() + 60
        try:
            while len(values) < count and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                values.update(r.value for records in batch.values() for r in records if r.value)
            await consumer.commit()
        finally:
            await consumer.stop()
        return len(values)

    return asyncio.run(run())


def kafka_python_produce(bootstrap: str, topic: str, count: int) -> int:
    from kafka import KafkaProducer  # type: ignore[import-untyped]

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        sent = [producer.send(topic, f"kafka-python-{i}".encode()) for i in range(count)]
        return sum(1 for future in sent if future.get(timeout=60))
    finally:
        producer.close()


def kafka_python_consume(bootstrap: str, topic: str, group: str, count: int) -> int:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False)  # fmt: skip
    values: set[bytes] = set()
    deadline = time.monotonic() + 60
    try:
        while len(values) < count and time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=500)
            values.update(r.value for records in batch.values() for r in records)
        consumer.commit()
    finally:
        consumer.close()
    return len(values)


# -- Go and JavaScript ----------------------------------------------------------------------


def go_client_cache() -> Path:
    """Where the set-up builds the Go client: named by its sources' hash (go.mod, go.sum,
    main.go), as kt_client_libraries in scripts/_setup.sh names it."""
    sources = b"".join((CLIENTS / "go" / name).read_bytes()
                       for name in ("go.mod", "go.sum", "main.go"))  # fmt: skip
    digest = hashlib.sha256(sources).hexdigest()[:12]
    return Path.home() / ".cache" / "kafkatunnel" / f"go-client-{digest}"


@pytest.fixture(scope="module")
def go_client() -> str:
    """The Go client the set-up built (a build on an empty Go cache takes minutes: never
    inside a test's deadline)."""
    binary = go_client_cache() / "client"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"the Go client is not built in {binary.parent}: scripts/test builds it")
    return str(binary)


def go(binary: str) -> tuple[Produce, Consume]:
    return (
        lambda b, t, n: _said([binary, "produce", b, t, str(n)], "PRODUCED"),
        lambda b, t, g, n: _said([binary, "consume", b, t, g, str(n)], "CONSUMED"),
    )


@pytest.fixture(scope="module")
def js_client() -> str:
    """client.mjs beside the npm packages the set-up installed (in its cache)."""
    lock = (CLIENTS / "js" / "package-lock.json").read_bytes()
    cache = (
        Path.home()
        / ".cache"
        / "kafkatunnel"
        / f"js-clients-{hashlib.sha256(lock).hexdigest()[:12]}"
    )
    if not (cache / "node_modules").is_dir():
        pytest.fail(f"the JavaScript clients are not installed in {cache}: scripts/test does")
    shutil.copy(CLIENTS / "js" / "client.mjs", cache / "client.mjs")
    return str(cache / "client.mjs")


def javascript(script: str, library: str) -> tuple[Produce, Consume]:
    base = ["node", script, library]
    return (
        lambda b, t, n: _said([*base, "produce", b, t, str(n)], "PRODUCED"),
        lambda b, t, g, n: _said([*base, "consume", b, t, g, str(n)], "CONSUMED"),
    )


# -- the tests ------------------------------------------------------------------------------


def every_coordinator(
    kafka: ApacheKafka, bootstrap: str, name: str, client: tuple[Produce, Consume]
) -> None:
    """The client produces MESSAGES, then a group on each broker reads every one of them:
    MESSAGES distinct values, a duplicate making up for no loss."""
    produce_with, consume_with = client
    topic = f"clients-{name}-{uuid.uuid4().hex[:6]}"
    assert produce_with(bootstrap, topic, MESSAGES) == MESSAGES
    spread = kafka.groups_by_coordinator(1, prefix=f"{topic}-g")
    assert sorted(spread) == [0, 1, 2]
    consumed = {node: consume_with(bootstrap, topic, group, MESSAGES)
                for node, (group,) in sorted(spread.items())}  # fmt: skip
    assert consumed == {0: MESSAGES, 1: MESSAGES, 2: MESSAGES}, consumed


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_the_java_client(
    apache_kafka: ApacheKafka, through: str, java_classes: str, protocol: str
) -> None:
    """With KIP-848's protocol the groups' ConsumerGroupHeartbeat went through the tunnel
    (the client did not fall back to the classic protocol), and with the classic none."""
    before = api_requests(through)
    every_coordinator(apache_kafka, through, f"java-{protocol}", java(java_classes, protocol))
    heartbeats = api_requests(through) - before
    assert (heartbeats[api_title(CONSUMER_GROUP_HEARTBEAT)] > 0) == (protocol == "consumer"), (
        heartbeats)  # fmt: skip


def test_the_java_client_in_share_groups(
    apache_kafka: ApacheKafka, through: str, java_classes: str
) -> None:
    """KIP-932 share groups (a preview in Kafka 4.1, its `share.version` feature on): a share
    group on every coordinator, each set to start at the earliest record with Kafka's own
    kafka-configs through the tunnel, reads every message with KafkaShareConsumer."""
    base = ["java", "-Xmx256m", JIT, "-cp", java_classes, "JavaClient"]

    def share(bootstrap: str, topic: str, group: str, count: int) -> int:
        earliest = "share.auto.offset.reset=earliest"
        configs = ["java", "-Xmx256m", JIT, "-cp", java_classes,
                   "org.apache.kafka.tools.ConfigCommand",
                   "--bootstrap-server", bootstrap, "--alter", "--entity-type", "groups",
                   "--entity-name", group, "--add-config", earliest]  # fmt: skip
        subprocess.run(configs, check=True, capture_output=True, timeout=DEADLINE)
        return _said([*base, "share", bootstrap, topic, group, str(count)], "CONSUMED")

    client = (java(java_classes, "classic")[0], share)
    before = api_requests(through)
    every_coordinator(apache_kafka, through, "java-share", client)
    sent = api_requests(through) - before
    for api in (SHARE_GROUP_HEARTBEAT, SHARE_FETCH):  # the share group's, not a classic one's
        assert sent[api_title(api)] > 0, (api_title(api), sent)


def test_kcat(apache_kafka: ApacheKafka, through: str) -> None:
    every_coordinator(apache_kafka, through, "kcat", (kcat_produce, kcat_consume))


def test_aiokafka(apache_kafka: ApacheKafka, through: str) -> None:
    every_coordinator(apache_kafka, through, "aiokafka", (aiokafka_produce, aiokafka_consume))


def test_kafka_python(apache_kafka: ApacheKafka, through: str) -> None:
    client = (kafka_python_produce, kafka_python_consume)
    every_coordinator(apache_kafka, through, "kafka-python", client)


def test_franz_go(apache_kafka: ApacheKafka, through: str, go_client: str) -> None:
    every_coordinator(apache_kafka, through, "franz-go", go(go_client))


@pytest.mark.parametrize("library", ["kafkajs", "platformatic"])
def test_javascript(apache_kafka: ApacheKafka, through: str, js_client: str, library: str) -> None:
    every_coordinator(apache_kafka, through, library, javascript(js_client, library))


def test_docs_clients_md_names_the_versions_tested() -> None:
    """docs/clients.md's table gives the version of each client that these tests ran."""
    import json
    import re

    import aiokafka
    import confluent_kafka
    import kafka

    from kafkatunnel.demo.apache import KAFKA_VERSION

    table = (Path(__file__).resolve().parents[2] / "docs" / "clients.md").read_text()
    rows = {row.split("|")[1].strip(): row.split("|")[3].strip()
            for row in table.splitlines() if row.startswith("| ") and "---" not in row}  # fmt: skip
    go_mod = (CLIENTS / "go" / "go.mod").read_text()
    franz = re.search(r"github.com/twmb/franz-go v(\S+)", go_mod)
    npm = json.loads((CLIENTS / "js" / "package.json").read_text())["dependencies"]
    assert franz is not None
    expected = {
        "Apache Kafka Java client (`kafka-clients`)": KAFKA_VERSION,
        "confluent-kafka (librdkafka)":
            f"{confluent_kafka.__version__} (librdkafka {confluent_kafka.libversion()[0]})",
        "aiokafka": aiokafka.__version__,
        "kafka-python": kafka.__version__,
        "franz-go": franz.group(1),
        "kafkajs": npm["kafkajs"],
        "@platformatic/kafka": npm["@platformatic/kafka"],
        "Kafka's tools (`kafka-topics`, `kafka-consumer-groups`, `kafka-share-groups`)":
            KAFKA_VERSION,
        "Apache Kafka share consumer (`KafkaShareConsumer`, KIP-932)": KAFKA_VERSION,
        "Kafka Streams (`kafka-streams`)": KAFKA_VERSION,
    }  # fmt: skip
    for client, version in expected.items():
        assert rows.get(client) == version, (client, rows.get(client), version)
