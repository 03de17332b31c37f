"""One Apache Kafka cluster for every test that needs it: they all live in this package,
so the cluster starts once per run and its three JVMs stop as soon as these tests end,
not idling beside the rest of the suite."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafkatunnel.demo import isolation_problem
from tests.worlds.apache import ApacheKafka

CLIENTS = Path(__file__).resolve().parent / "clients"


@pytest.fixture(scope="package")
def apache_kafka() -> Iterator[ApacheKafka]:
    """Apache Kafka, three KRaft nodes in a network of their own, and the identity provider
    of its `oauth` listener (Keycloak), started beside it."""
    problem = isolation_problem()
    if problem:
        pytest.skip(f"needs network isolation, which is unavailable: {problem}")
    with ApacheKafka(oauth=True) as kafka:
        yield kafka


@pytest.fixture(scope="package")
def java_classes(apache_kafka: ApacheKafka, tmp_path_factory: pytest.TempPathFactory) -> str:
    return java_classes_at(apache_kafka, tmp_path_factory.mktemp("java-client"))


def java_classes_at(kafka: ApacheKafka, out: Path) -> str:
    """The classpath of the Java client programs (clients/*.java, compiled into `out` by
    javac against the cluster's own kafka-clients) and Kafka's jars, its tools among them."""
    if shutil.which("javac") is None:
        pytest.fail("javac is missing: scripts/test installs openjdk-17-jdk-headless")
    subprocess.run(["javac", "-cp", f"{kafka.lib}/*", "-d", str(out),
                    str(CLIENTS / "JavaClient.java")], check=True, timeout=180)  # fmt: skip
    return f"{kafka.lib}/*:{out}"


@pytest.fixture(scope="package")
def streams_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    """StreamsCounter (clients/StreamsCounter.java) compiled, and the classpath that runs it."""
    from tests.apache.test_streams import streams_classpath_at

    return streams_classpath_at(tmp_path_factory.mktemp("streams-counter"))
