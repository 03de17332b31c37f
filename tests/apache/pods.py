"""The real services beside the reference cluster, each run as a pod would run it: on an
address of its own in the cluster's network namespace, reaching the brokers by their
in-cluster names.

- Kafka Connect (org.apache.kafka:connect-runtime, Kafka's own release, at CONNECT_VERSION:
  scripts/kafka-connect/pom.xml says why a release behind the brokers), one distributed
  worker as Strimzi runs it: group `shop-connect`, its configs, offsets and statuses in
  Kafka topics, the REST API on 8083. Its connectors and their offsets live in those
  topics, so a worker started again in the same place carries on where the last one
  stopped, as a restarted pod does.
- Apicurio Registry 2.4.2.Final (io.apicurio:apicurio-registry-app, assembled by Quarkus's
  build: scripts/apicurio-registry/pom.xml says why that release), its Confluent-compatible
  API on 8080 under /apis/ccompat/v7, storage in memory (the release's default).

scripts/test fetches both into ~/.cache/kafkatunnel/ (scripts/_setup.sh)."""

from __future__ import annotations

import http.client
import json
import os
from pathlib import Path
from typing import Any

from kafkatunnel.demo.apache import HEAP, JIT, LOG4J
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.waiting import wait_for
from tests.worlds.apache import ApacheKafka

APICURIO_VERSION = "2.4.2.Final"
CONNECT_VERSION = "4.3.1"  # scripts/kafka-connect/pom.xml's <connect.version>
CONNECT_ADDRESS, CONNECT_PORT = "127.0.0.21", 8083
REGISTRY_ADDRESS, REGISTRY_PORT = "127.0.0.22", 8080
CCOMPAT = "/apis/ccompat/v7"
START_TIMEOUT = 120.0  # a JVM scanning its plugins on two busy cores


def _cache(variable: str, default: str, marker: str) -> Path:
    """A directory scripts/_setup.sh fills, or AssertionError saying how to fill it."""
    configured = os.environ.get(variable)
    where = Path(configured) if configured else Path.home() / ".cache/kafkatunnel" / default
    assert (where / marker).exists(), (
        f"{where / marker} is missing: scripts/test fetches it from Maven Central "
        f"(scripts/_setup.sh), or set {variable}"
    )
    return where


def connect_lib() -> Path:
    return _cache("KT_CONNECT_LIB", f"kafka-connect-{CONNECT_VERSION}/lib",
                  f"connect-runtime-{CONNECT_VERSION}.jar")  # fmt: skip


def apicurio_home() -> Path:
    return _cache("KT_APICURIO_HOME", f"apicurio-registry-{APICURIO_VERSION}",
                  "apicurio-registry-runner-1-runner.jar")  # fmt: skip


def inside(
    kafka: ApacheKafka, address: str, port: int, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    """An HTTP request from inside the cluster's network, as another pod makes it; the
    status and the JSON answer (None when empty)."""
    assert kafka.namespace is not None
    sock = kafka.namespace.connect(address, port, timeout=10)
    connection = http.client.HTTPConnection(address, port, timeout=30)
    connection.sock = sock
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        connection.request(method, path, body=data, headers=headers)
        answer = connection.getresponse()
        text = answer.read()
        return answer.status, json.loads(text) if text.strip() else None
    finally:
        connection.close()


def _answers(kafka: ApacheKafka, address: str, port: int, path: str) -> bool:
    try:
        return inside(kafka, address, port, "GET", path)[0] == 200
    except (OSError, http.client.HTTPException, ValueError):
        return False


class ConnectWorker:
    """Kafka Connect's distributed worker as pod `name`; `restart()` replaces its process in
    the same place, as a StatefulSet replaces a deleted pod."""

    def __init__(self, kafka: ApacheKafka, workdir: Path, name: str) -> None:
        self.kafka, self.name = kafka, name
        self.lib = connect_lib()
        self.config = workdir / "connect-distributed.properties"
        self.log4j = workdir / "connect-log4j2.properties"
        self.process: ManagedProcess | None = None

    def start(self) -> ConnectWorker:
        bootstrap = ",".join(b.address for b in self.kafka.brokers("plain"))
        settings = {
            "bootstrap.servers": bootstrap,
            "group.id": "shop-connect",
            "config.storage.topic": "shop-connect-configs",
            "offset.storage.topic": "shop-connect-offsets",
            "status.storage.topic": "shop-connect-status",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "offset.flush.interval.ms": "1000",
            "listeners": f"http://{CONNECT_ADDRESS}:{CONNECT_PORT}",
            "rest.advertised.host.name": CONNECT_ADDRESS,
            "plugin.discovery": "service_load",  # the FileStream connectors, by their manifests
        }
        self.config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        self.log4j.write_text(LOG4J)  # the brokers' own: warnings and errors
        argv = ["java", *HEAP, f"-Dlog4j2.configurationFile={self.log4j}", "-cp",
                f"{self.lib}/*", "org.apache.kafka.connect.cli.ConnectDistributed",
                str(self.config)]  # fmt: skip
        self.process = ManagedProcess(self.kafka.inside(argv), name=self.name)
        wait_for(lambda: _answers(self.kafka, CONNECT_ADDRESS, CONNECT_PORT, "/connectors"),
                 timeout=START_TIMEOUT, what=f"Kafka Connect ({self.name}) to answer")  # fmt: skip
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=20)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


class ApicurioRegistry:
    """Apicurio Registry as pod `name`, its data in memory."""

    def __init__(self, kafka: ApacheKafka, name: str) -> None:
        self.kafka, self.name = kafka, name
        self.home = apicurio_home()
        self.process: ManagedProcess | None = None

    def start(self) -> ApicurioRegistry:
        argv = ["java", "-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", JIT,
                f"-Dquarkus.http.host={REGISTRY_ADDRESS}", f"-Dquarkus.http.port={REGISTRY_PORT}",
                "-jar", str(self.home / "apicurio-registry-runner-1-runner.jar")]  # fmt: skip
        self.process = ManagedProcess(self.kafka.inside(argv), name=self.name)
        subjects, what = f"{CCOMPAT}/subjects", f"Apicurio Registry ({self.name}) to answer"
        wait_for(lambda: _answers(self.kafka, REGISTRY_ADDRESS, REGISTRY_PORT, subjects),
                 timeout=START_TIMEOUT, what=what)  # fmt: skip
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=20)
            self.process = None
