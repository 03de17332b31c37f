"""Kafka Streams through `kafkatunnel up`, as a Java team runs an application on a laptop
against the cluster: StreamsCounter (tests/apache/clients/), compiled here with javac
against kafka-streams at the brokers' version, counts orders per customer through a
repartition and a state store with a changelog, exactly once (`exactly_once_v2`). With the
classic rebalance protocol and with KIP-1071's streams protocol:

- applications whose groups have their coordinators on every broker count every order
  once, read back with read_committed;
- two instances of one application share its tasks (a rebalance through the tunnel); one
  is killed (SIGKILL) mid-run, the other takes its tasks and still counts every order once;
- `kafkatunnel verify --strict` judges each recording: every application's group and every
  transactional id ok."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kafkatunnel.demo.apache import JIT, KAFKA_VERSION
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.probe import ProbeConnection
from kafkatunnel.protocol import api_title
from kafkatunnel.waiting import wait_for
from tests.apache.pods import _cache
from tests.apache.test_apache_kafka import tunnel
from tests.apache.test_clients import CLIENTS, api_requests
from tests.worlds.apache import ApacheKafka

STREAMS_GROUP_HEARTBEAT = 88  # KIP-1071's, offered by brokers that run streams groups
PARTITIONS = 3  # of the input: three tasks for each of the two sub-topologies
TASKS = frozenset(f"{sub}_{partition}" for sub in (0, 1) for partition in range(PARTITIONS))
CUSTOMERS = 7
ORDERS = 300
# Deadlines: a JVM starting and joining its group on two busy cores; a lost instance's
# session timing out and its open transaction aborted before the other reads past it.
RUNNING, COUNTED = 120.0, 180.0
STATE_LINE = re.compile(r"^STATE (\S+) TASKS (\S*)$")


def streams_lib() -> Path:
    return _cache("KT_STREAMS_LIB", f"kafka-streams-{KAFKA_VERSION}/lib",
                  f"kafka-streams-{KAFKA_VERSION}.jar")  # fmt: skip


def streams_classpath_at(out: Path) -> str:
    """StreamsCounter compiled into `out`, and the classpath that runs it."""
    if shutil.which("javac") is None:
        pytest.fail("javac is missing: scripts/test installs openjdk-17-jdk-headless")
    lib = streams_lib()
    subprocess.run(["javac", "-cp", f"{lib}/*", "-d", str(out),
                    str(CLIENTS / "StreamsCounter.java")], check=True, timeout=180)  # fmt: skip
    return f"{lib}/*:{out}"


@pytest.fixture(params=["classic", "streams"])
def protocol(request: pytest.FixtureRequest, apache_kafka: ApacheKafka) -> str:
    """group.protocol: the classic one, and KIP-1071's, which the reference cluster offers
    (Kafka 4.4's defaults): a broker without it would have Streams fail to start."""
    if request.param == "streams":
        with ProbeConnection(apache_kafka.bootstrap(), connect=apache_kafka.connect) as probe:
            offered = probe.api_versions()
        assert STREAMS_GROUP_HEARTBEAT in offered, (
            f"Apache Kafka {apache_kafka.version} does not offer StreamsGroupHeartbeat: "
            f"streams groups need `streams` in group.coordinator.rebalance.protocols and "
            f"the streams.version feature"
        )
    return str(request.param)


class Instance:
    """One StreamsCounter JVM, its state and active tasks as it last printed them."""

    def __init__(self, classpath: str, name: str, *args: str) -> None:
        self.name = name
        argv = ["java", "-Xmx256m", JIT, "-cp", classpath, "StreamsCounter", *args]
        self.process = ManagedProcess(argv, name=name)

    def trouble(self) -> str | None:
        """What went wrong, if it did: the process ended, or Streams stopped on an error."""
        failed = [line for line in list(self.process.lines) if line.startswith("FAILED ")]
        if failed or not self.process.alive():
            return f"{self.name}: {failed or 'exited'}\n{self.process.output()[-3000:]}"
        return None

    def states(self) -> list[tuple[str, frozenset[str]]]:
        """Every (state, active tasks) it printed, in order."""
        said = [STATE_LINE.match(line) for line in list(self.process.lines)]
        return [(m[1], frozenset(filter(None, m[2].split(",")))) for m in said if m]

    def running(self) -> frozenset[str] | None:
        """Its active tasks while it is RUNNING, None otherwise."""
        states = self.states()
        return states[-1][1] if states and states[-1][0] == "RUNNING" else None

    def rebalances(self) -> int:
        return sum(1 for state, _ in self.states() if state == "REBALANCING")

    def stop(self) -> None:
        """SIGTERM: Streams closes, committing what it processed (see closed)."""
        self.process.stop(timeout=45)

    def closed(self) -> bool:
        return "CLOSED" in self.process.lines

    def kill(self) -> None:
        """SIGKILL, as an OOM kill or a laptop's lid closing ends it: no close, its open
        transaction left for the brokers to abort."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.popen.wait(timeout=10)


def until_running(
    instances: Sequence[Instance],
    settled: Callable[[list[frozenset[str]]], bool],
    what: str,
) -> list[frozenset[str]]:
    """Wait until every instance is RUNNING and their tasks are `settled`; fails at once,
    with its output, if one of them failed."""

    def check() -> tuple[str | None, list[frozenset[str]]] | None:
        for instance in instances:
            if (trouble := instance.trouble()) is not None:
                return trouble, []
        tasks = [instance.running() for instance in instances]
        running = [t for t in tasks if t is not None]
        return (None, running) if len(running) == len(tasks) and settled(running) else None

    trouble, tasks = wait_for(check, timeout=RUNNING, what=what, interval=0.2)
    assert trouble is None, trouble
    return tasks


def split(tasks: list[frozenset[str]]) -> bool:
    """Two instances' tasks: each has some, and together they have each task once."""
    first, second = tasks
    return bool(first and second) and first | second == TASKS and not first & second


def topics(bootstrap: str, *names: str) -> None:
    """Create the topics, three replicas each, as a team's platform would beforehand."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, PARTITIONS, 3) for name in names])
    for future in futures.values():
        future.result(60)


def customer(order: int) -> str:
    return f"customer-{order % CUSTOMERS}"


class Orders:
    """An idempotent producer of orders (each acknowledged order is in the input once),
    counting what the brokers acknowledged per customer."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = confluent_kafka.Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True}
        )
        self.sent = 0
        self.acknowledged: Counter[str] = Counter()

    def _delivered(self, error: object, message: confluent_kafka.Message) -> None:
        value = message.value()
        if error is None and value is not None:
            self.acknowledged[str(value, "utf-8").split(",")[1]] += 1

    def produce(self, count: int) -> None:
        for order in range(self.sent, self.sent + count):
            self.producer.produce(self.topic, key=f"order-{order}",
                                  value=f"order-{order},{customer(order)}",
                                  on_delivery=self._delivered)  # fmt: skip
        self.sent += count
        assert self.producer.flush(60) == 0, "orders not delivered in 60 s"
        assert sum(self.acknowledged.values()) == self.sent, self.acknowledged


class Counts:
    """An application's output read with read_committed: each customer's latest count,
    which is how many of its orders the application counted, if it counted each once."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.consumer = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"{topic}-reader",
            "isolation.level": "read_committed", "enable.auto.commit": False,
        })  # fmt: skip
        partitions = [confluent_kafka.TopicPartition(topic, p) for p in range(PARTITIONS)]
        for partition in partitions:
            partition.offset = confluent_kafka.OFFSET_BEGINNING
        self.consumer.assign(partitions)
        self.latest: dict[str, int] = {}
        self.records = 0

    def read(self) -> dict[str, int]:
        """What has been committed so far."""
        for message in self.consumer.consume(1000, timeout=0.2):
            if message.error() is None:
                key, value = message.key(), message.value()
                assert key is not None and value is not None
                self.latest[str(key, "utf-8")] = int.from_bytes(value, "big", signed=True)
                self.records += 1
        return self.latest

    def reach(self, total: int) -> dict[str, int]:
        """Wait until the counts add up to at least `total`."""
        return wait_for(lambda: sum(self.read().values()) >= total and self.latest,
                        timeout=COUNTED, what=f"{self.topic} to count {total}")  # fmt: skip

    def to_the_end(self) -> dict[str, int]:
        """Everything committed, once the application has stopped (no transaction open)."""
        ends = {}
        for p in range(PARTITIONS):
            partition = confluent_kafka.TopicPartition(self.topic, p)
            ends[p] = self.consumer.get_watermark_offsets(partition, timeout=30)[1]

        def at_the_end() -> bool:
            self.read()
            positions = self.consumer.position(
                [confluent_kafka.TopicPartition(self.topic, p) for p in range(PARTITIONS)]
            )
            return all(ends[tp.partition] == 0 or tp.offset >= ends[tp.partition]
                       for tp in positions)  # fmt: skip

        wait_for(at_the_end, timeout=60, what=f"the end of {self.topic}", interval=0.1)
        self.consumer.commit(asynchronous=False)  # a reader's group commits where it got to
        self.consumer.close()
        return self.latest


def judged_ok(recording: Path, protocol: str, applications: Sequence[str]) -> None:
    """verify --strict on the recording: every verdict ok; each application's group among
    them, of the protocol's type, and at least one transactional id of each (its
    exactly_once_v2 producers: APPLICATION-PROCESS-THREAD)."""
    result = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", "--in-process", "--json", "-",
         "--strict", str(recording)], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr
    judged = {g["key"]: g for g in json.loads(result.stdout)["groups"]}
    assert {g["verdict"] for g in judged.values()} == {"ok"}, judged
    for application in applications:
        assert judged[application]["group_type"] == protocol, judged[application]
        assert any(key.startswith(f"{application}-") and g["kind"] == "transactional_id"
                   for key, g in judged.items()), (application, sorted(judged))  # fmt: skip


def heartbeats_as(protocol: str, before: Counter[str], bootstrap: str) -> None:
    """With KIP-1071's protocol the applications' StreamsGroupHeartbeat went through the
    tunnel (Streams did not fall back to the classic protocol); with the classic, none."""
    sent = api_requests(bootstrap) - before
    title = api_title(STREAMS_GROUP_HEARTBEAT)
    assert (sent[title] > 0) == (protocol == "streams"), sent


def test_exactly_once_counts_on_every_coordinator(
    apache_kafka: ApacheKafka, streams_classpath: str, protocol: str, tmp_path: Path
) -> None:
    """Three applications, their groups' coordinators on brokers 0, 1 and 2, count the same
    orders (half produced before they start, half while they run): each customer's count
    is exactly its number of orders."""
    name = f"streams-{protocol}-{uuid.uuid4().hex[:6]}"
    spread = apache_kafka.groups_by_coordinator(1, prefix=name)
    assert sorted(spread) == [0, 1, 2]
    applications = [group for _, (group,) in sorted(spread.items())]
    recording = tmp_path / "recording"
    with tunnel(apache_kafka, "plain", "--record", str(recording)) as bootstrap:
        before = api_requests(bootstrap)
        topics(bootstrap, f"{name}-orders", *(f"{app}-counts" for app in applications))
        orders = Orders(bootstrap, f"{name}-orders")
        orders.produce(ORDERS // 2)
        instances = [
            Instance(streams_classpath, app, bootstrap, app, orders.topic, f"{app}-counts",
                     protocol, str(tmp_path / app))
            for app in applications
        ]  # fmt: skip
        try:
            until_running(instances, lambda tasks: all(t == TASKS for t in tasks),
                          "each application to run all its tasks")  # fmt: skip
            orders.produce(ORDERS - ORDERS // 2)
            readers = [Counts(bootstrap, f"{app}-counts") for app in applications]
            for reader in readers:
                reader.reach(ORDERS)
        finally:
            for instance in instances:
                instance.stop()
        for instance in instances:
            assert instance.closed(), instance.process.output()[-3000:]
        counted = {
            app: reader.to_the_end() for app, reader in zip(applications, readers, strict=True)
        }
        heartbeats_as(protocol, before, bootstrap)
    for app in applications:
        assert counted[app] == dict(orders.acknowledged), (app, counted[app], orders.acknowledged)
    judged_ok(recording, protocol, applications)


def test_two_instances_share_the_tasks_and_one_survives_the_others_kill(
    apache_kafka: ApacheKafka, streams_classpath: str, protocol: str, tmp_path: Path
) -> None:
    """One application, two instances: the second's arrival splits the tasks between them;
    killed (SIGKILL) while orders keep coming, its tasks move to the first, and every
    order is still counted once, none twice (its uncommitted transaction aborted)."""
    name = f"streams-pair-{protocol}-{uuid.uuid4().hex[:6]}"
    (application,) = apache_kafka.groups_by_coordinator(1, prefix=name)[1]
    recording = tmp_path / "recording"
    with tunnel(apache_kafka, "plain", "--record", str(recording)) as bootstrap:
        before = api_requests(bootstrap)
        output = f"{application}-counts"
        topics(bootstrap, f"{name}-orders", output)
        orders = Orders(bootstrap, f"{name}-orders")
        orders.produce(ORDERS)
        args = [bootstrap, application, orders.topic, output, protocol]

        def instance(which: str) -> Instance:
            return Instance(streams_classpath, f"{application}-{which}", *args,
                            str(tmp_path / which))  # fmt: skip

        first = instance("first")
        second: Instance | None = None
        enough = threading.Event()
        ordering: threading.Thread | None = None
        try:
            until_running([first], lambda tasks: tasks == [TASKS], "the first instance")
            reader = Counts(bootstrap, output)
            reader.reach(ORDERS)
            second = instance("second")
            shared = until_running([first, second], split, "the two instances to share the tasks")

            def keep_ordering() -> None:  # ten orders every 20 ms, at most
                while not enough.is_set():
                    orders.produce(10)
                    enough.wait(0.02)

            ordering = threading.Thread(target=keep_ordering, name="orders")
            ordering.start()
            reader.reach(ORDERS + 200)  # both are counting the orders coming in
            second.kill()
            killed = time.monotonic()
            until_running([first], lambda tasks: tasks == [TASKS],
                          "the first instance to take the killed one's tasks")  # fmt: skip
            took_over = time.monotonic() - killed
            reader.reach(sum(orders.acknowledged.values()) + 200)  # it counts them too
            enough.set()
            ordering.join(timeout=120)
            reader.reach(orders.sent)
        finally:
            enough.set()
            if ordering is not None:
                ordering.join(timeout=120)
            first.stop()
            if second is not None:
                second.process.stop()
        assert first.closed(), first.process.output()[-3000:]
        counted = reader.to_the_end()
        heartbeats_as(protocol, before, bootstrap)
    print(f"{protocol}: {orders.sent} orders, {reader.records} counts read, tasks shared "
          f"{sorted(shared[0])} / {sorted(shared[1])}, the first rebalanced "
          f"{first.rebalances()} times, took over in {took_over:.1f} s")  # fmt: skip
    assert counted == dict(orders.acknowledged), (counted, orders.acknowledged)
    judged_ok(recording, protocol, [application])


def test_the_streams_jars_are_fetched_at_the_clusters_version() -> None:
    """scripts/kafka-streams/pom.xml names the version scripts/apache-kafka/pom.xml does
    (the set-up passes that one; the pom's own is what `mvn -f` alone would fetch)."""
    pom = (CLIENTS.parents[2] / "scripts" / "kafka-streams" / "pom.xml").read_text()
    assert f"<kafka.version>{KAFKA_VERSION}</kafka.version>" in pom
