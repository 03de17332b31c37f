"""`kafkatunnel run -- CMD` with applications as their users start them, on Apache Kafka
4.4, each consuming with a group on every coordinator: Kafka's console consumer reading
the client.properties KAFKA_CLIENT_PROPERTIES names, a Java program that reads only
SPRING_KAFKA_BOOTSTRAP_SERVERS from its environment (as Spring Boot's relaxed binding
does) and a Node program (kafkajs) reading KAFKA_BOOTSTRAP_SERVERS; and `run --record
--verify`, one line for CI, passing a consumer whose group is on broker 1 and failing the
same consumer behind a forward that leads every broker to broker 0."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kafkatunnel.demo import free_port_run
from kafkatunnel.demo.apache import JIT, broker_host
from tests.apache.test_clients import DEADLINE, MESSAGES
from tests.apache.test_clients import js_client as js_client  # the fixture, for this module
from tests.worlds.apache import SCRAM_PASSWORD, SCRAM_USER, ApacheKafka

CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"


def _run(
    kafka: ApacheKafka,
    script: str,
    *up: str,
    timeout: float = 300,
    exec_template: str = "",
    listener: str = "plain",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "kafkatunnel", "run", "--bootstrap", kafka.bootstrap(listener),
            "--exec", exec_template or kafka.exec_template(), "--listen",
            f"127.0.0.1:{free_port_run(8)}", *up, "--", "sh", "-c", script]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})  # fmt: skip


def _topic_and_groups(kafka: ApacheKafka, java_classes: str, name: str) -> tuple[str, list[str]]:
    """A topic with MESSAGES records, produced inside the cluster's network, not through a
    tunnel, and a group coordinated by each broker."""
    topic = f"run-{name}-{uuid.uuid4().hex[:6]}"
    client = ["java", "-Xmx256m", JIT, "-cp", java_classes, "JavaClient", "produce"]
    produce = kafka.inside([*client, kafka.bootstrap(), topic, str(MESSAGES)])
    result = subprocess.run(produce, capture_output=True, text=True, timeout=DEADLINE)
    assert f"PRODUCED {MESSAGES}" in result.stdout, result.stderr[-2000:]
    spread = kafka.groups_by_coordinator(1, prefix=f"{topic}-g")
    assert sorted(spread) == [0, 1, 2]
    return topic, [group for (group,) in (spread[n] for n in sorted(spread))]


def test_kafkas_console_consumer_reads_the_client_properties(
    apache_kafka: ApacheKafka, java_classes: str, tmp_path: Path
) -> None:
    topic, groups = _topic_and_groups(apache_kafka, java_classes, "console")
    classpath = shlex.quote(f"{apache_kafka.lib}/*")
    consume = " && ".join(
        f"java -Xmx256m {JIT} -cp {classpath} {CONSOLE_CONSUMER} "
        f'--bootstrap-server "$KAFKA_BOOTSTRAP_SERVERS" --command-config '
        f'"$KAFKA_CLIENT_PROPERTIES" --topic {topic} --group {group} --from-beginning '
        f"--max-messages {MESSAGES} --timeout-ms 60000 > {tmp_path / group}"
        for group in groups
    )
    done = _run(apache_kafka, consume)
    assert done.returncode == 0, done.stderr[-3000:]
    for group in groups:
        assert len(set((tmp_path / group).read_text().split())) == MESSAGES, group


def test_an_env_only_java_program_and_a_node_program_consume(
    apache_kafka: ApacheKafka, java_classes: str, js_client: str
) -> None:
    topic, groups = _topic_and_groups(apache_kafka, java_classes, "apps")
    java_program = f"java -Xmx256m {JIT} -cp {shlex.quote(java_classes)} JavaClient"
    node_program = f"node {shlex.quote(js_client)} kafkajs"
    script = " && ".join(
        [f"{java_program} consume env:SPRING_KAFKA_BOOTSTRAP_SERVERS {topic} {g}-java "
         f"{MESSAGES} classic" for g in groups]
        + [f"{node_program} consume env:KAFKA_BOOTSTRAP_SERVERS {topic} {g}-node {MESSAGES}"
           for g in groups]
    )  # fmt: skip
    done = _run(apache_kafka, script, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    consumed = [line for line in done.stdout.splitlines() if line.startswith("CONSUMED ")]
    assert consumed == [f"CONSUMED {MESSAGES}"] * 6, done.stdout


# A librdkafka application (confluent-kafka) that reads the tunnel's settings from the
# file KCAT_CONFIG names and adds its own login, from variables of its own: it prints how
# it was told to log in, then consumes MESSAGES records with the group it is given.
OWN_LOGIN_CONSUMER = """\
import os, sys, time
import confluent_kafka
config = dict(line.split("=", 1) for line in open(os.environ["KCAT_CONFIG"]).read().splitlines())
print("TOLD", config.get("security.protocol"), config.get("sasl.mechanism"))
config |= {"sasl.username": os.environ["APP_USER"], "sasl.password": os.environ["APP_PASSWORD"],
           "group.id": sys.argv[2], "auto.offset.reset": "earliest"}
consumer = confluent_kafka.Consumer(config)
consumer.subscribe([sys.argv[1]])
seen, deadline = set(), time.monotonic() + 120
while len(seen) < int(sys.argv[3]) and time.monotonic() < deadline:
    message = consumer.poll(1)
    if message is not None and message.error() is None:
        seen.add(message.value())
consumer.close()
print("CONSUMED", len(seen))
"""


def test_a_client_that_logs_in_itself_is_told_the_protocol_and_mechanism(
    apache_kafka: ApacheKafka, java_classes: str, tmp_path: Path
) -> None:
    """`run` in front of a SCRAM-SHA-256 listener with no login flags: the tunnel passes
    the clients' own logins through, so it hands the command security.protocol
    SASL_PLAINTEXT and the one mechanism the listener enables (as it named it), never a
    user or a password; a librdkafka application adding only its own user and password
    consumes with a group on every coordinator."""
    topic, groups = _topic_and_groups(apache_kafka, java_classes, "own-login")
    program = tmp_path / "consumer.py"
    program.write_text(OWN_LOGIN_CONSUMER)
    script = " && ".join(f"{sys.executable} {program} {topic} {group} {MESSAGES}"
                         for group in groups)  # fmt: skip
    script = f'echo "HELD BY $(env | grep -c -- "{SCRAM_PASSWORD}")"; {script}'
    done = _run(apache_kafka, script, listener="scram256",
                env={"APP_USER": SCRAM_USER, "APP_PASSWORD": SCRAM_PASSWORD})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stdout.splitlines() if line.startswith(("HELD", "TOLD",
                                                                          "CONSUMED"))]  # fmt: skip
    assert said[0] == "HELD BY 1", "only the application's own variable holds the password"
    assert said[1:] == ["TOLD SASL_PLAINTEXT SCRAM-SHA-256", f"CONSUMED {MESSAGES}"] * 3, said


@pytest.mark.parametrize("misrouted", [False, True], ids=["routed", "all-to-broker-0"])
def test_run_record_verify_passes_a_routed_consumer_and_fails_a_misrouted_one(
    apache_kafka: ApacheKafka, java_classes: str, tmp_path: Path, misrouted: bool
) -> None:
    """A Java consumer (Kafka 4.4's client) whose group broker 1 coordinates, through `run
    --record DIR --verify`. Routed, it reads every record and run exits 0. Misrouted (every
    broker's forward opened to broker 0, as one port-forward and a hosts entry do), broker
    0 refuses the connections meant for broker 1 (REBOOTSTRAP_REQUIRED, KIP-1242), run
    exits non-zero, says verify failed, and the recording judges the group misrouted."""
    topic, groups = _topic_and_groups(apache_kafka, java_classes, "verify")
    group = groups[1]
    template = apache_kafka.exec_template()
    if misrouted:
        template = template.replace("{host}", broker_host(0))
    record = tmp_path / "recording"
    consume = (f"java -Xmx256m {JIT} -cp {shlex.quote(java_classes)} JavaClient consume "
               f'"$KAFKA_BOOTSTRAP_SERVERS" {topic} {group} {MESSAGES} classic')  # fmt: skip
    done = _run(apache_kafka, consume, "--record", str(record), "--verify",
                exec_template=template, timeout=600)  # fmt: skip
    report = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", "--in-process", "--json", "-",
         str(record)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    verdicts = {v["key"]: v for v in json.loads(report.stdout)["groups"]}
    if not misrouted:
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"CONSUMED {MESSAGES}" in done.stdout, done.stdout[-2000:]
        assert verdicts[group]["verdict"] == "ok", verdicts[group]
        return
    assert done.returncode != 0, done.stdout[-2000:]
    assert "verify failed" in done.stderr or "verify: failed" in done.stderr, done.stderr[-3000:]
    assert verdicts[group]["verdict"] == "misrouted", verdicts[group]
    assert "REBOOTSTRAP_REQUIRED" in " ".join(verdicts[group]["reasons"]), verdicts[group]
