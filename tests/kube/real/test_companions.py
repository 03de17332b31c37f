"""The services beside Kafka, through `up`, in the real cluster: Kafka Connect's distributed
worker (Kafka's own release, tests/apache/pods.py) in a pod laid out as Strimzi lays out a
KafkaConnect (`<name>-connect-0`, its labels, the REST API service `<name>-connect-api` on
8083 named `rest-api`), beside the Strimzi Kafka of the `strimzi_kafka` fixture. Every byte
goes kubectl -> kube-apiserver -> kubelet -> containerd -> the pod; the Service and its
selector are real objects the tunnel reads.

`--companions` finds the service by Strimzi's conventions, and a connector created at the
printed URL delivers its records through the tunnel, also after the worker's pod is made
again with a new IP. `--service` with `--dns` serves it by its in-cluster URL on a laptop
(a network namespace whose resolver, unbound, sends the cluster's zones to the shim), where
the brokers too are reached by their in-cluster names."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kafkatunnel.demo import free_port_run
from kafkatunnel.demo.netns import NetworkNamespace
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.waiting import wait_for
from tests.apache.pods import CONNECT_PORT, CONNECT_VERSION, connect_lib
from tests.apache.test_companions import consume, create_file_connector, http, lines, running
from tests.kube.conftest import KUBECTLS, NEWEST
from tests.worlds.apache import LISTENERS
from tests.worlds.kubernetes import JAVA, KubernetesCluster, pod_manifest
from tests.worlds.strimzi_pods import StrimziKafka

CONNECT = "my-connect"  # the KafkaConnect's name
POD, SERVICE = f"{CONNECT}-connect-0", f"{CONNECT}-connect-api"
LABELS = {"strimzi.io/cluster": CONNECT, "strimzi.io/kind": "KafkaConnect",
          "strimzi.io/name": f"{CONNECT}-connect",
          "app.kubernetes.io/name": "kafka-connect",
          "app.kubernetes.io/instance": CONNECT,
          "app.kubernetes.io/part-of": f"strimzi-{CONNECT}",
          "app.kubernetes.io/managed-by": "strimzi-cluster-operator"}  # fmt: skip
LIBS, FILES = "/opt/kafka/libs", "/opt/kafka/files"
START_TIMEOUT = 240.0  # a JVM scanning its plugins on two busy cores


@dataclass
class ConnectPod:
    """The worker's pod and where its FileStream connectors' files are (host, pod)."""

    kube: KubernetesCluster
    kafka: StrimziKafka
    files: Path

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.kafka.namespace}/pods/{POD}"

    def manifest(self) -> dict[str, Any]:
        brokers = ",".join(b.address for b in self.kafka.brokers("plain"))
        settings = {
            "bootstrap.servers": brokers,
            "group.id": CONNECT,
            "config.storage.topic": f"{CONNECT}-configs",
            "offset.storage.topic": f"{CONNECT}-offsets",
            "status.storage.topic": f"{CONNECT}-status",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "offset.flush.interval.ms": "1000",
            "listeners": f"http://0.0.0.0:{CONNECT_PORT}",
            "plugin.discovery": "service_load",
        }
        properties = "".join(f"{k}={v}\n" for k, v in settings.items())
        config, copy = self.kafka.hosts_copy
        start = (
            f"until [ -s {config}/hosts ]; do sleep 0.2; done && "
            f"cat {config}/hosts >> /etc/hosts && "
            # its own address, as Strimzi advertises it (from the pod's status)
            'printf "%srest.advertised.host.name=%s\\n" "$PROPERTIES" "$POD_IP" '
            "> /tmp/connect.properties && "
            "exec java -Xms64m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 "
            f"-Dsun.net.inetaddr.ttl=1 -Dlog4j2.configurationFile={config}/log4j2.properties "
            f"-cp '{LIBS}/*' org.apache.kafka.connect.cli.ConnectDistributed "
            "/tmp/connect.properties"
        )
        pod = pod_manifest(POD, ["/bin/sh", "-c", start], image=JAVA.name,
                           ports={"rest-api": CONNECT_PORT}, labels=LABELS,
                           env={"PROPERTIES": properties, "POD_IP": "status.podIP"},
                           host_paths={LIBS: connect_lib(), config: copy,
                                       FILES: self.files})  # fmt: skip
        pod["spec"]["containers"][0]["readinessProbe"] = {
            "httpGet": {"path": "/connectors", "port": CONNECT_PORT},
            "periodSeconds": 1, "failureThreshold": 1}  # fmt: skip
        return pod

    def start(self) -> dict[str, Any]:
        self.kube.create_pod(self.manifest(), namespace=self.kafka.namespace)
        pod = self.kube.wait_pod_ready(POD, namespace=self.kafka.namespace, timeout=START_TIMEOUT)
        self.kafka.resolve_in(pod)
        return pod

    def replace(self) -> dict[str, Any]:
        """Deleted and made again, as its StrimziPodSet does: a new pod, a new IP."""
        self.kube.delete_pod(POD, namespace=self.kafka.namespace, timeout=120)
        return self.start()

    def file(self, name: str) -> tuple[Path, Path]:
        """A new file for a FileStream source: on the host, and as the pod sees it."""
        (self.files / name).touch()
        return self.files / name, Path(FILES) / name


@pytest.fixture(scope="module")
def connect_pod(
    kubernetes: KubernetesCluster,
    strimzi_kafka: StrimziKafka,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ConnectPod]:
    """The Connect worker's pod and its `-connect-api` Service, as Strimzi makes them."""
    namespace = strimzi_kafka.namespace
    files = tmp_path_factory.mktemp("connect-files")
    files.chmod(0o755)
    worker = ConnectPod(kubernetes, strimzi_kafka, files)
    kubernetes.api("POST", f"/api/v1/namespaces/{namespace}/services", {
        "metadata": {"name": SERVICE, "labels": LABELS},
        "spec": {"type": "ClusterIP",
                 "selector": {k: LABELS[k] for k in ("strimzi.io/cluster", "strimzi.io/kind",
                                                     "strimzi.io/name")},
                 "ports": [{"name": "rest-api", "port": CONNECT_PORT,
                            "targetPort": CONNECT_PORT, "protocol": "TCP"}]},
    })  # fmt: skip
    try:
        worker.start()
        yield worker
    finally:
        kubernetes.delete_pod(POD, namespace=namespace, timeout=120)
        kubernetes.api("DELETE", f"/api/v1/namespaces/{namespace}/services/{SERVICE}")


def kubectl_env(kafka: StrimziKafka) -> dict[str, str]:
    """The user's environment: the cluster's kubeconfig, the newest real kubectl."""
    return {**os.environ, "KUBECONFIG": str(kafka.kubeconfig),
            "PATH": f"{Path(KUBECTLS[NEWEST]).parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip


def status(prefix: list[str], env: dict[str, str]) -> dict[str, Any]:
    asked = [*prefix, sys.executable, "-m", "kafkatunnel", "status", "--json"]
    said = subprocess.run(asked, capture_output=True, text=True, timeout=30, env=env, check=True)
    answer: dict[str, Any] = json.loads(said.stdout)
    return answer


def test_companions_finds_connect_and_its_connector_delivers_before_and_after_its_pod_moves(
    connect_pod: ConnectPod,
) -> None:
    """`up --companions` with nothing else: Connect's URL printed, a FileStream connector
    created there delivers records read through the tunnel; the worker's pod is made again
    with a new IP and the connector carries on through the same URL."""
    topic = f"companion-{uuid.uuid4().hex[:6]}"
    host_file, pod_file = connect_pod.file(f"{topic}.txt")
    env = kubectl_env(connect_pod.kafka)
    up = ManagedProcess(
        [sys.executable, "-m", "kafkatunnel", "up", "--no-table", "--companions",
         "--listen", f"127.0.0.1:{free_port_run(8)}"],
        name="kafkatunnel-up-real-companions", env=env,
    )  # fmt: skip
    try:
        bootstrap = up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=120)[1]
        connect = up.wait_for_line(r"^connect: (\S+) ", timeout=60)[1]
        assert connect.startswith("http://127.0.0.1:"), connect
        assert http("GET", connect)["version"] == CONNECT_VERSION

        create_file_connector(connect, f"{topic}-file", pod_file, topic)
        written = lines(host_file, 0, 10)
        group = f"{topic}-reader"
        # the topic's partitions each keep their order, not the file's: sorted
        assert sorted(consume(bootstrap, topic, group, 10, timeout=90)) == written

        before = connect_pod.kube.api("GET", connect_pod.path)["status"]["podIP"]
        after = connect_pod.replace()["status"]["podIP"]
        assert after != before, "the pod came back with its old IP: nothing was shown"
        wait_for(lambda: running(connect, f"{topic}-file"), timeout=120,
                 what="the connector to run again, through the same URL")  # fmt: skip
        # kubectl outlives the pod it forwards to; its next connection fails ("network
        # namespace for sandbox ... is closed") and the tunnel replaces the forward
        route = next(c["route"] for c in status([], env)["companions"] if c["name"] == SERVICE)
        assert re.search(r"\[1 (dropped|replaced); last: ", route), route
        later = lines(host_file, 10, 10)
        assert sorted(consume(bootstrap, topic, group, 10, timeout=90)) == later
    finally:
        up.stop()
    assert "Traceback" not in up.output(), up.output()[-3000:]


def test_service_and_dns_serve_connect_and_the_brokers_by_their_in_cluster_names(
    connect_pod: ConnectPod, tmp_path: Path
) -> None:
    """On a laptop whose unbound sends the cluster's zones to the shim: `up --service
    my-connect-connect-api --dns` prints Connect's in-cluster URL, and a program using only
    that URL and the in-cluster bootstrap address creates a connector and reads its records."""
    from tests.dns.test_real_resolvers import RESOLV_CONF, SHIM, unbound

    kafka = connect_pod.kafka
    topic = f"named-{uuid.uuid4().hex[:6]}"
    host_file, pod_file = connect_pod.file(f"{topic}.txt")
    in_cluster = f"http://{SERVICE}.{kafka.namespace}.svc.cluster.local:{CONNECT_PORT}"
    env = kubectl_env(kafka)
    api = kafka.kube.port  # the kubeconfig's server: the same port, on the laptop's loopback
    with NetworkNamespace(resolv_conf=RESOLV_CONF) as laptop:
        prefix = laptop.exec_prefix()
        relay = ManagedProcess([*prefix, "socat", f"TCP-LISTEN:{api},bind=127.0.0.1,fork,reuseaddr",
                                f"UNIX-CONNECT:{kafka.kube.workdir / 'apiserver.sock'}"],
                               name="laptop-apiserver-relay")  # fmt: skip
        relay.wait_accepting(api, timeout=10, connect=laptop.connect)
        up = resolver = None
        try:
            up = ManagedProcess(
                [*prefix, sys.executable, "-m", "kafkatunnel", "up", "--no-table",
                 "--service", SERVICE, "--dns", "--dns-listen", f"{SHIM[0]}:{SHIM[1]}",
                 "--dns-setup", "none"],
                name="laptop-up-real-companions", env=env,
            )  # fmt: skip
            up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=120)
            bootstrap = f"{kafka.broker_host(0)}:{LISTENERS['plain']}"  # as a pod would say it
            assert up.wait_for_line(r"^connect: (\S+) ", timeout=60)[1] == in_cluster
            zones = status(prefix, env)["dns"]["zones"]
            resolver = ManagedProcess([*prefix, *unbound(tmp_path, zones)], name="unbound-real")

            def resolves() -> bool:
                asked = [
                    *prefix,
                    "getent",
                    "hosts",
                    f"{SERVICE}.{kafka.namespace}.svc.cluster.local",
                ]
                return bool(subprocess.run(asked, capture_output=True, timeout=30).stdout)

            wait_for(resolves, timeout=20, what="unbound to answer for the cluster's zones")
            # read from the file's start once the connector runs
            written = lines(host_file, 0, 10)
            program = subprocess.run(
                [*prefix, sys.executable, "-c",
                 "import sys; from pathlib import Path; "
                 "from tests.apache.test_companions import consume, create_file_connector; "
                 "create_file_connector(sys.argv[1], sys.argv[3] + '-file', Path(sys.argv[4]), "
                 "sys.argv[3]); "
                 "print(sorted(v.decode() for v in consume(sys.argv[2], sys.argv[3], "
                 "sys.argv[3] + '-reader', 10, timeout=90)))",
                 in_cluster, bootstrap, topic, str(pod_file)],
                capture_output=True, text=True, timeout=240, env=env,
                cwd=Path(__file__).resolve().parents[3],
            )  # fmt: skip
            assert program.stdout.strip() == str(sorted(w.decode() for w in written)), (
                program.stderr[-3000:])  # fmt: skip
        finally:
            for process in (resolver, up, relay):
                if process is not None:
                    process.stop()
    assert up is not None and "Traceback" not in up.output(), up.output()[-3000:]
