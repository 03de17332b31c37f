"""`up --isolate` on Apache Kafka 4.4: a "deployed" application runs inside the cluster's
network, straight to the brokers (tests/apache/clients/deployed.py), and the same
application with the same configuration runs on the laptop through the tunnel. Isolated,
the local consumer reads every record while the deployed group's assignment and committed
offsets never change, and the local transactional producer commits while the deployed one
is never fenced, and a deployed share consumer receives every record; without --isolate,
the same runs show the harm the flag prevents; with --isolate-from-deployed the local
consumer starts where the deployed group committed. A Kafka Streams application is refused
under --isolate with the reason, before it writes anything. `down --clean` deletes the
isolated groups, and the deployed group stays."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafkatunnel.demo import isolation_problem
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.demo.workload import consume_group, produce, produce_transaction
from kafkatunnel.waiting import wait_for
from tests.apache.conftest import java_classes_at
from tests.apache.test_apache_kafka import tunnel, tunnel_process
from tests.apache.test_groups import consumed, judged, share_consumer, share_from_earliest
from tests.apache.test_streams import Instance, streams_classpath_at, topics
from tests.worlds.apache import ApacheKafka

DEPLOYED = Path(__file__).resolve().parent / "clients" / "deployed.py"
SUFFIX = "kt-laptop"
ISOLATE = ("--isolate", "--isolate-suffix", SUFFIX)
RECORDS = 30
PARTITIONS = 3
GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
TOPICS = "org.apache.kafka.tools.TopicCommand"
FENCED_WITHIN = 60.0


# A cluster of its own (no identity provider: no test here logs in), so that these tests
# run beside the rest of tests/apache on another worker, not after them on the same one.
# The fixtures that depend on the cluster are this module's too.
@pytest.fixture(scope="module")
def apache_kafka() -> Iterator[ApacheKafka]:
    problem = isolation_problem()
    if problem:
        pytest.skip(f"needs network isolation, which is unavailable: {problem}")
    with ApacheKafka() as kafka:
        yield kafka


@pytest.fixture(scope="module")
def java_classes(apache_kafka: ApacheKafka, tmp_path_factory: pytest.TempPathFactory) -> str:
    return java_classes_at(apache_kafka, tmp_path_factory.mktemp("java-client"))


@pytest.fixture(scope="module")
def streams_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    return streams_classpath_at(tmp_path_factory.mktemp("streams-counter"))


def _topic(kafka: ApacheKafka, prefix: str) -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kafka.tool(TOPICS, "--bootstrap-server", kafka.bootstrap(), "--create", "--topic", topic,
               "--partitions", str(PARTITIONS), "--replication-factor", "3")  # fmt: skip
    return topic


def _deployed(kafka: ApacheKafka, *args: str) -> ManagedProcess:
    """deployed.py inside the cluster's network, as the copy in Kubernetes runs."""
    argv = kafka.inside([sys.executable, str(DEPLOYED), args[0], kafka.bootstrap(), *args[1:]])
    return ManagedProcess(argv, name=f"deployed-{args[0]}")


def _said(process: ManagedProcess, prefix: str) -> list[str]:
    return [line for line in list(process.lines) if line.startswith(prefix)]


def _committed(kafka: ApacheKafka, group: str, topic: str) -> dict[int, str]:
    """The group's committed offset of each partition of `topic`, as kafka-consumer-groups
    shows it straight from the cluster ("-": none)."""
    described = _described(kafka, group, topic)
    return {partition: current for partition, (current, _) in described.items()}


def _described(kafka: ApacheKafka, group: str, topic: str) -> dict[int, tuple[str, int]]:
    """Each partition of `topic`: the group's committed offset ("-": none) and its end."""
    described = kafka.tool(GROUPS, "--bootstrap-server", kafka.bootstrap(), "--describe",
                           "--group", group)  # fmt: skip
    rows = [line.split() for line in described.splitlines()]
    return {int(r[2]): (r[3], int(r[4])) for r in rows if len(r) > 4 and r[1] == topic}


def _groups(kafka: ApacheKafka) -> set[str]:
    return set(kafka.tool(GROUPS, "--bootstrap-server", kafka.bootstrap(), "--list").split())


def _port(bootstrap: str) -> str:
    return bootstrap.split(",")[0].rsplit(":", 1)[1]


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_an_isolated_consumer_reads_everything_and_the_deployed_group_never_changes(
    apache_kafka: ApacheKafka, protocol: str, tmp_path: Path
) -> None:
    """The deployed consumer (classic or KIP-848 protocol) holds every partition of its
    group and commits nothing. Through --isolate, the local consumer of the same group.id
    reads every record and commits; the deployed one keeps its assignment and member id,
    and its group still has no committed offset, while GROUP.SUFFIX has the local ones.
    The recording holds GROUP.SUFFIX, and verify judges it, naming GROUP beside it.
    `down --clean` deletes GROUP.SUFFIX and leaves the deployed group. Without --isolate
    the same local run takes partitions from the deployed consumer and commits in its
    group."""
    topic = _topic(apache_kafka, f"isolate-{protocol}")
    group = f"orders-{protocol}-{uuid.uuid4().hex[:6]}"
    deployed = _deployed(apache_kafka, "consume", group, topic, protocol)
    try:
        wait_for(lambda: _said(deployed, "ASSIGNED 0,1,2"), timeout=90,
                 what="the deployed consumer holding every partition")  # fmt: skip
        recording = tmp_path / "recording"
        with tunnel(apache_kafka, "plain", *ISOLATE, "--record", str(recording)) as bootstrap:
            assert produce(bootstrap, topic, RECORDS) == RECORDS
            wait_for(lambda: _said(deployed, f"CONSUMED {RECORDS}"), timeout=60,
                     what=f"the deployed consumer reading the {RECORDS} records")  # fmt: skip
            local = consume_group(bootstrap, group, topic, RECORDS, timeout=90,
                                  config={"group.protocol": protocol})  # fmt: skip
            assert local.consumed == RECORDS, local.errors
            assert _said(deployed, "REVOKED") == [], deployed.output()[-3000:]
            assert len(_said(deployed, "ASSIGNED")) == 1, deployed.output()[-3000:]
            assert set(_committed(apache_kafka, group, topic).values()) <= {"-"}
            isolated = _committed(apache_kafka, f"{group}.{SUFFIX}", topic)
            assert sum(int(o) for o in isolated.values()) == RECORDS, isolated
            cleaned = subprocess.run(
                [sys.executable, "-m", "kafkatunnel", "down", "--clean", "--port",
                 _port(bootstrap)], capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert cleaned.returncode == 0, cleaned.stderr
            assert f"deleted group {group}.{SUFFIX}" in cleaned.stdout, cleaned.stdout
        left = _groups(apache_kafka)
        assert group in left and f"{group}.{SUFFIX}" not in left, left
        code, verdicts, said = judged(recording, "--strict")
        assert code == 0, said
        verdict = verdicts[f"{group}.{SUFFIX}"]
        assert (verdict["verdict"], verdict["client_key"]) == ("ok", group), verdict
        assert group not in verdicts, verdicts  # the cluster never heard the client's name

        with tunnel(apache_kafka, "plain") as bootstrap:  # the harm --isolate prevents
            harmful = consume_group(bootstrap, group, topic, 1, timeout=90,
                                    config={"group.protocol": protocol})  # fmt: skip
            assert harmful.consumed == 1, harmful.errors
        assert _said(deployed, "REVOKED"), deployed.output()[-3000:]
        assert set(_committed(apache_kafka, group, topic).values()) - {"-"}
    finally:
        deployed.stop()


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_isolate_from_deployed_starts_at_the_deployed_groups_offsets_and_never_moves_them(
    apache_kafka: ApacheKafka, protocol: str
) -> None:
    """The deployed group has committed the end of the topic's first records. Through
    --isolate --isolate-from-deployed, the local consumer of the same group.id, with
    auto.offset.reset=earliest, reads only the records after them; the deployed group's
    offsets are as they were, and the isolated group committed the end of each partition
    it read (a partition it read nothing of keeps no offset of its own: librdkafka commits
    no position it was told is committed, and its next run starts there again)."""
    topic = _topic(apache_kafka, f"from-deployed-{protocol}")
    group = f"billing-{protocol}-{uuid.uuid4().hex[:6]}"
    later = 12
    with tunnel(apache_kafka, "plain") as bootstrap:
        assert produce(bootstrap, topic, RECORDS, prefix="early") == RECORDS
    apache_kafka.tool(GROUPS, "--bootstrap-server", apache_kafka.bootstrap(), "--reset-offsets",
                      "--group", group, "--topic", topic, "--to-latest", "--execute")  # fmt: skip
    deployed = _committed(apache_kafka, group, topic)
    assert sum(int(o) for o in deployed.values()) == RECORDS, deployed
    with tunnel(apache_kafka, "plain", *ISOLATE, "--isolate-from-deployed") as bootstrap:
        assert produce(bootstrap, topic, later, prefix="late") == later
        local = consume_group(bootstrap, group, topic, later, timeout=90,
                              config={"group.protocol": protocol})  # fmt: skip
    assert local.consumed == later, local.errors
    assert all(v.startswith(b"late-") for v in local.values), local.values
    assert _committed(apache_kafka, group, topic) == deployed
    isolated = _described(apache_kafka, f"{group}.{SUFFIX}", topic)
    own = {p: end for p, (current, end) in isolated.items() if current != "-"}
    assert all(isolated[p][0] == str(end) for p, end in own.items()), isolated
    assert sum(end - int(deployed[p]) for p, end in own.items()) == later, (isolated, deployed)


def test_an_isolated_transactional_producer_never_fences_the_deployed_one(
    apache_kafka: ApacheKafka,
) -> None:
    """The deployed producer commits a transaction every 0.2 s. The local one, with the
    same transactional.id through --isolate, commits its own, and the deployed one goes on
    committing, never fenced; without --isolate the local one fences it."""
    topic = _topic(apache_kafka, "isolate-txn")
    transactional_id = f"payments-{uuid.uuid4().hex[:6]}"
    deployed = _deployed(apache_kafka, "transact", topic, transactional_id)
    try:
        wait_for(lambda: _said(deployed, "COMMITTED 3"), timeout=90,
                 what="the deployed producer committing")  # fmt: skip
        with tunnel(apache_kafka, "plain", *ISOLATE) as bootstrap:
            for _ in range(3):
                produce_transaction(bootstrap, topic, transactional_id, 5, timeout=60)
        done = len(_said(deployed, "COMMITTED"))
        wait_for(lambda: len(_said(deployed, "COMMITTED")) >= done + 5, timeout=60,
                 what="the deployed producer committing after the local run")  # fmt: skip
        assert _said(deployed, "FENCED") == [] and deployed.alive(), deployed.output()[-3000:]

        with tunnel(apache_kafka, "plain") as bootstrap:  # the harm --isolate prevents
            produce_transaction(bootstrap, topic, transactional_id, 5, timeout=60)
        wait_for(lambda: _said(deployed, "FENCED"), timeout=FENCED_WITHIN,
                 what="the deployed producer fenced by the local one")  # fmt: skip
    finally:
        deployed.stop()


def test_the_deployed_share_consumer_receives_every_record_of_the_local_run(
    apache_kafka: ApacheKafka, java_classes: str
) -> None:
    """The deployed share consumer (KIP-932) and the local one of the same group.id through
    --isolate run side by side, and each receives every record produced meanwhile: the
    local one's group is GROUP.SUFFIX. Without --isolate the local one, alone in the group,
    acknowledges the records, and the deployed one, reading after it, receives none."""
    topic = _topic(apache_kafka, "isolate-share")
    group, taken = (f"{name}-{uuid.uuid4().hex[:6]}" for name in ("share", "share-taken"))
    share_from_earliest(apache_kafka, [group, f"{group}.{SUFFIX}", taken])

    def deployed(group: str, seconds: int) -> ManagedProcess:
        argv = share_consumer(java_classes, apache_kafka.bootstrap(), topic, group, RECORDS,
                              seconds)  # fmt: skip
        return ManagedProcess(apache_kafka.inside(argv), name="deployed-share")

    def local(bootstrap: str, group: str) -> int:
        argv = share_consumer(java_classes, bootstrap, topic, group, RECORDS, 90)
        return consumed(subprocess.run(argv, capture_output=True, text=True, timeout=150))

    beside = deployed(group, 90)
    try:
        with tunnel(apache_kafka, "plain", *ISOLATE) as bootstrap:
            assert produce(bootstrap, topic, RECORDS) == RECORDS
            assert local(bootstrap, group) == RECORDS
        said = wait_for(lambda: _said(beside, "CONSUMED"), timeout=120,
                        what="the deployed share consumer's count")  # fmt: skip
        assert said == [f"CONSUMED {RECORDS}"], beside.output()[-3000:]
    finally:
        beside.stop()

    with tunnel(apache_kafka, "plain") as bootstrap:  # the harm --isolate prevents
        assert local(bootstrap, taken) == RECORDS
    after = deployed(taken, 15)
    try:
        said = wait_for(lambda: _said(after, "CONSUMED"), timeout=90,
                        what="the deployed share consumer's count")  # fmt: skip
        assert said == ["CONSUMED 0"], after.output()[-3000:]
    finally:
        after.stop()


@pytest.mark.parametrize(
    ("protocol", "refused"), [("classic", "JoinGroup"), ("streams", "StreamsGroupHeartbeat")]
)
def test_a_streams_application_is_refused_under_isolate_before_it_writes(
    apache_kafka: ApacheKafka, streams_classpath: str, tmp_path: Path, protocol: str,
    refused: str
) -> None:  # fmt: skip
    """Kafka Streams' application id also names its internal topics, the deployed
    application's: under --isolate its group is refused (its classic JoinGroup, or
    KIP-1071's heartbeat), Streams stops on the authorization error, and the tunnel says
    why and what to do; no internal topic of the application exists afterwards."""
    application = f"counter-{uuid.uuid4().hex[:6]}"
    with tunnel_process(apache_kafka, "plain", *ISOLATE) as (bootstrap, up):
        topics(bootstrap, f"{application}-orders", f"{application}-counts")
        instance = Instance(streams_classpath, application, bootstrap, application,
                            f"{application}-orders", f"{application}-counts", protocol,
                            str(tmp_path / "state"))  # fmt: skip
        try:
            failed = wait_for(lambda: _said(instance.process, "FAILED"), timeout=120,
                              what="Streams stopping on the refusal")  # fmt: skip
        finally:
            instance.stop()
        assert re.search(r"GroupAuthorization|not authorized", failed[0], re.I), failed
        said = wait_for(lambda: [line for line in list(up.lines) if f"refused {refused}" in line],
                        timeout=10, what="the tunnel saying why it refused")  # fmt: skip
        assert "does not isolate Kafka Streams" in said[0] and "application.id" in said[0], said
    internal = [t for t in _topics(apache_kafka) if t.startswith(f"{application}-")]
    assert sorted(internal) == [f"{application}-counts", f"{application}-orders"], internal


def _topics(kafka: ApacheKafka) -> list[str]:
    return kafka.tool(TOPICS, "--bootstrap-server", kafka.bootstrap(), "--list").split()
