"""The real services beside Apache Kafka, reached through `up` as a developer reaches them:
Kafka Connect (a release behind the brokers: pods.py) behind Strimzi's `<name>-connect-api`
service and Apicurio Registry 2.4.2.Final behind its 2.x operator's `<name>-service`
(tests/apache/pods.py runs them as pods of the reference cluster's network). The real
kubectl forwards them through the API server stand-in (tests/kube/apiserver.py), whose
world is this cluster: its three brokers, the Connect worker and the registry, each on its
own pod address.

A connector created through the URL `up` prints delivers records that a consumer reads
through the tunnel; confluent-kafka's Avro serializer registers its schema at the printed
registry URL and a fresh deserializer reads it back by id; the Connect pod is replaced and
its connector carries on. With --dns the same works by the services' in-cluster names, on a
laptop whose resolver (unbound) sends the cluster's zones to the shim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kafkatunnel.demo import free_port, free_port_run
from kafkatunnel.demo.apache import broker_address
from kafkatunnel.demo.netns import NetworkNamespace
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.waiting import wait_for
from tests.apache.pods import (
    CCOMPAT,
    CONNECT_ADDRESS,
    CONNECT_PORT,
    CONNECT_VERSION,
    REGISTRY_ADDRESS,
    REGISTRY_PORT,
    ApicurioRegistry,
    ConnectWorker,
    inside,
)
from tests.kube.conftest import APISERVER, KUBECTLS, NEWEST, apiserver_certificate, kubeconfig
from tests.worlds.apache import LISTENERS, ApacheKafka

pytestmark = pytest.mark.skipif(not KUBECTLS, reason="no real kubectl on this machine")

ROOT = Path(__file__).resolve().parents[2]
BROKERS = {"app.kubernetes.io/name": "kafka", "app.kubernetes.io/instance": "shop"}
CONNECT = {"strimzi.io/kind": "KafkaConnect", "strimzi.io/cluster": "shop-connect",
           "strimzi.io/name": "shop-connect-connect"}  # fmt: skip
REGISTRY = {"apicur.io/type": "ApicurioRegistry", "apicur.io/name": "registry", "app": "registry"}
CONNECT_POD, REGISTRY_POD = "shop-connect-connect-0", "registry-deployment-5d8f9-x2k4p"
CONNECT_SERVICE, REGISTRY_SERVICE = "shop-connect-connect-api", "registry-service"
IN_CLUSTER_CONNECT = f"http://{CONNECT_SERVICE}.kafka.svc.cluster.local:{CONNECT_PORT}"
IN_CLUSTER_REGISTRY = f"http://{REGISTRY_SERVICE}.kafka.svc.cluster.local:{REGISTRY_PORT}{CCOMPAT}"
ORDER = json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"}]})  # fmt: skip


def world(kafka: ApacheKafka) -> dict[str, Any]:
    """The cluster as the API server serves it: namespace "kafka" (the brokers' names say
    so) with the brokers, the Connect worker and the registry, each on its pod address."""
    assert kafka.namespace is not None
    plain = LISTENERS["plain"]
    pods = [{"name": f"kafka-{n}", "ip": broker_address(n), "address": broker_address(n),
             "ports": [plain], "labels": BROKERS} for n in range(kafka.nodes)]  # fmt: skip
    pods += [
        {"name": CONNECT_POD, "ip": CONNECT_ADDRESS, "address": CONNECT_ADDRESS,
         "ports": [CONNECT_PORT], "labels": CONNECT, "port_names": {"8083": "rest-api"}},
        {"name": REGISTRY_POD, "ip": REGISTRY_ADDRESS, "address": REGISTRY_ADDRESS,
         "ports": [REGISTRY_PORT], "labels": REGISTRY, "port_names": {"8080": "http"}},
    ]  # fmt: skip
    services = {
        "kafka-headless": {"selector": BROKERS},
        CONNECT_SERVICE: {"selector": CONNECT, "labels": CONNECT, "ports": [
            {"name": "rest-api", "port": CONNECT_PORT, "targetPort": CONNECT_PORT}]},
        REGISTRY_SERVICE: {"selector": REGISTRY, "labels": REGISTRY, "ports": [
            {"name": "http", "port": REGISTRY_PORT, "targetPort": "http"}]},
    }  # fmt: skip
    kafka_namespace = {"pods": pods, "services": services,
                       "statefulsets": {"kafka": {"selector": BROKERS}}}  # fmt: skip
    return {"current_context": "kind-demo", "namespace": "default", "netns": kafka.namespace.name,
            "namespaces": {"default": {"pods": []}, "kafka": kafka_namespace}}  # fmt: skip


@dataclass
class Beside:
    """The cluster with its services running, and where the API server's world is."""

    kafka: ApacheKafka
    connect: ConnectWorker
    registry: ApicurioRegistry
    world: Path
    workdir: Path


@pytest.fixture(scope="module")
def beside(apache_kafka: ApacheKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Beside]:
    """Connect and the registry started once for this module's tests."""
    workdir = tmp_path_factory.mktemp("beside-kafka")
    path = workdir / "world.json"
    path.write_text(json.dumps(world(apache_kafka)))
    registry = ApicurioRegistry(apache_kafka, REGISTRY_POD)
    connect = ConnectWorker(apache_kafka, workdir, CONNECT_POD)
    try:
        registry.start()
        connect.start()
        yield Beside(apache_kafka, connect, registry, path, workdir)
    finally:
        connect.stop()
        registry.stop()


@contextmanager
def api_server(path: Path, workdir: Path, prefix: list[str], port: int) -> Iterator[dict[str, str]]:
    """The API server over the world (run with `prefix`, e.g. inside a laptop's namespace)
    and the environment in which the newest real kubectl uses it."""
    cert, key = apiserver_certificate(workdir)
    server = ManagedProcess([*prefix, sys.executable, str(APISERVER), str(path), str(port),
                             str(cert), str(key)], name="apiserver-apache")  # fmt: skip
    config = workdir / "kubeconfig"
    config.write_text(kubeconfig(port, cert))
    bin_dir = workdir / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "kubectl").exists():
        (bin_dir / "kubectl").symlink_to(KUBECTLS[NEWEST])
    try:
        server.wait_for_line(r"^serving on ", timeout=30)
        yield {**os.environ, "KUBECONFIG": str(config), "KUBECACHEDIR": str(workdir / "cache"),
               "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               "KAFKATUNNEL_STATE_DIR": str(workdir / "state")}  # fmt: skip
    finally:
        server.stop()


# -- what a developer's program does, on the laptop -------------------------------------------


def consume(bootstrap: str, topic: str, group: str, count: int, timeout: float = 60) -> list[bytes]:
    """Up to `count` record values of `topic` read as `group` before the deadline."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                values.append(message.value() or b"")
    finally:
        consumer.close()
    return values


def avro_round_trip(bootstrap: str, registry: str, topic: str, count: int = 20) -> None:
    """Avro records produced with the schema registered at `registry`, consumed and
    deserialized by a fresh client that must fetch the schema by the id each record names."""
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    context = SerializationContext(topic, MessageField.VALUE)
    serialize = AvroSerializer(SchemaRegistryClient({"url": registry}), ORDER)
    sent = [{"id": i, "item": f"item-{i}"} for i in range(count)]
    producer = Producer({"bootstrap.servers": bootstrap})
    for order in sent:
        producer.produce(topic, serialize(order, context))
    assert producer.flush(30) == 0
    values = consume(bootstrap, topic, f"{topic}-avro", count)
    fresh = SchemaRegistryClient({"url": registry})
    deserialize = AvroDeserializer(fresh)
    got = [deserialize(v, context) for v in values]  # in each partition's order: sorted
    assert sorted(got, key=lambda order: order["id"]) == sent, [order["id"] for order in got]
    registered = fresh.get_latest_version(f"{topic}-value")
    assert {int.from_bytes(v[1:5], "big") for v in values} == {registered.schema_id}
    assert values[0][0] == 0  # Confluent's wire format: magic byte, schema id, Avro


def http(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as answer:
        text = answer.read()
    return json.loads(text) if text.strip() else None


def create_file_connector(connect: str, name: str, file: Path, topic: str) -> None:
    """Kafka's FileStreamSource connector, created at `connect`, running its task."""
    config = {"connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector",
              "tasks.max": "1", "file": str(file), "topic": topic}  # fmt: skip
    created = http("POST", f"{connect}/connectors", {"name": name, "config": config})
    assert created["name"] == name, created
    wait_for(lambda: running(connect, name), timeout=60, what=f"connector {name} to run")


def running(connect: str, name: str) -> bool:
    try:
        status = http("GET", f"{connect}/connectors/{name}/status")
    except OSError:
        return False
    tasks = status.get("tasks", [])
    return bool(status["connector"]["state"] == "RUNNING" and tasks
                and all(t["state"] == "RUNNING" for t in tasks))  # fmt: skip


def lines(file: Path, first: int, count: int) -> list[bytes]:
    """Append lines `first`.. to the connector's file; the values it will produce."""
    written = [f"order {i}".encode() for i in range(first, first + count)]
    with file.open("ab") as out:
        out.write(b"".join(w + b"\n" for w in written))
    return written


def in_cluster_round_trips(bootstrap: str, file: str, topic: str) -> None:
    """On the laptop, by the in-cluster URLs only: a connector created at Connect's, its
    records consumed; Avro records registered at the registry's, read back."""
    create_file_connector(IN_CLUSTER_CONNECT, f"{topic}-file", Path(file), topic)
    written = lines(Path(file), 0, 10)
    assert sorted(consume(bootstrap, topic, f"{topic}-lines", 10)) == written
    avro_round_trip(bootstrap, IN_CLUSTER_REGISTRY, f"{topic}-avro")


# -- the tests --------------------------------------------------------------------------------


def test_connect_and_apicurio_through_up_companions_and_a_connect_pod_restart(
    beside: Beside, tmp_path: Path
) -> None:
    """`up --companions` finds both services; the connector created at the printed Connect
    URL delivers its records through the tunnel, before and after its pod is replaced, and
    Avro records go through with their schema at the printed registry URL."""
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    with api_server(beside.world, tmp_path, [], free_port()) as env:
        up = ManagedProcess(
            [sys.executable, "-m", "kafkatunnel", "up", "--via", "kubectl", "-n", "kafka",
             "--listen", f"127.0.0.1:{free_port_run(8)}", "--no-table", "--companions"],
            name="kafkatunnel-up-apache-companions", env=env,
        )  # fmt: skip
        try:
            bootstrap = up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=90)[1]
            registry = up.wait_for_line(r"^schema\.registry\.url=(\S+)$", timeout=30)[1]
            connect = up.wait_for_line(r"^connect: (\S+) ", timeout=30)[1]
            assert registry.startswith("http://127.0.0.1:") and registry.endswith(CCOMPAT)
            assert http("GET", connect)["version"] == CONNECT_VERSION

            avro_round_trip(bootstrap, registry, topic)
            status, answer = inside(beside.kafka, REGISTRY_ADDRESS, REGISTRY_PORT, "GET",
                                    f"{CCOMPAT}/subjects")  # fmt: skip
            assert (status, f"{topic}-value" in answer) == (200, True), answer  # in the pod

            file = beside.workdir / f"{topic}.txt"
            file.touch()
            create_file_connector(connect, f"{topic}-file", file, f"{topic}-lines")
            written = lines(file, 0, 10)
            group = f"{topic}-lines-reader"
            # the topic's three partitions each keep their order, not the file's: sorted
            assert sorted(consume(bootstrap, f"{topic}-lines", group, 10)) == written

            # The worker's pod is replaced; the forward follows it and the connector resumes.
            began = time.monotonic()
            beside.connect.stop()
            Path(f"{beside.world}.lost-{CONNECT_POD}").touch()  # kubectl's stream to it ends
            beside.connect.start()  # answering inside the cluster
            wait_for(lambda: running(connect, f"{topic}-file"), timeout=90,
                     what="the connector to run again, through the same URL")  # fmt: skip
            print(
                f"the connector ran again through the tunnel {time.monotonic() - began:.1f}s "
                "after its old worker began to stop"
            )
            asked = [sys.executable, "-m", "kafkatunnel", "status", "--json"]
            said = subprocess.run(asked, capture_output=True, text=True, timeout=30, env=env)
            listed = json.loads(said.stdout)["companions"]
            route = next(c["route"] for c in listed if c["name"] == CONNECT_SERVICE)
            assert "[1 dropped; last: error: lost connection to pod]" in route, route
            later = lines(file, 10, 10)
            assert sorted(consume(bootstrap, f"{topic}-lines", group, 10)) == later
        finally:
            up.stop()
    assert "Traceback" not in up.output(), up.output()[-3000:]


def test_connect_and_apicurio_by_in_cluster_names_with_dns_and_service(
    beside: Beside, tmp_path: Path
) -> None:
    """`up --service` for each, with --dns, on a laptop whose unbound sends the cluster's
    zones to the shim: the in-cluster URLs `up` prints are the ones the program uses."""
    from tests.dns.test_real_resolvers import RESOLV_CONF, SHIM, unbound

    topic = f"named-{uuid.uuid4().hex[:6]}"
    file = beside.workdir / f"{topic}.txt"
    file.touch()
    with (NetworkNamespace(resolv_conf=RESOLV_CONF) as laptop,
          api_server(beside.world, tmp_path, laptop.exec_prefix(), 6443) as env):  # fmt: skip
        up = ManagedProcess(
            [*laptop.exec_prefix(), sys.executable, "-m", "kafkatunnel", "up", "--via",
             "kubectl", "-n", "kafka", "--no-table", "--service", CONNECT_SERVICE,
             "--service", REGISTRY_SERVICE, "--dns", "--dns-listen", f"{SHIM[0]}:{SHIM[1]}",
             "--dns-setup", "none"],
            name="laptop-up-apache", env=env,
        )  # fmt: skip
        resolver = None
        try:
            bootstrap = up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=90)[1]
            assert up.wait_for_line(r"^schema\.registry\.url=(\S+)$", timeout=30)[1] == (
                IN_CLUSTER_REGISTRY)  # fmt: skip
            assert up.wait_for_line(r"^connect: (\S+) ", timeout=30)[1] == IN_CLUSTER_CONNECT
            asked = [*laptop.exec_prefix(), sys.executable, "-m", "kafkatunnel", "status", "--json"]
            status = json.loads(subprocess.run(asked, capture_output=True, text=True, timeout=30,
                                               env=env, check=True).stdout)  # fmt: skip
            resolver = ManagedProcess([*laptop.exec_prefix(),
                                       *unbound(tmp_path, status["dns"]["zones"])],
                                      name="unbound-apache")  # fmt: skip

            def resolves() -> bool:
                asked = [*laptop.exec_prefix(), "getent", "hosts",
                         f"{REGISTRY_SERVICE}.kafka.svc.cluster.local"]  # fmt: skip
                return bool(subprocess.run(asked, capture_output=True, timeout=30).stdout)

            wait_for(resolves, timeout=20, what="unbound to answer for the cluster's zones")
            program = subprocess.run(
                [*laptop.exec_prefix(), sys.executable, "-c",
                 "import sys; from tests.apache.test_companions import in_cluster_round_trips; "
                 "in_cluster_round_trips(*sys.argv[1:]); print('ROUND TRIPS')",
                 bootstrap, str(file), topic],
                capture_output=True, text=True, timeout=240, env=env, cwd=ROOT,
            )  # fmt: skip
            assert program.stdout.strip() == "ROUND TRIPS", program.stderr[-3000:]
        finally:
            up.stop()
            if resolver is not None:
                resolver.stop()
    assert "Traceback" not in up.output(), up.output()[-3000:]
