"""Apache Kafka in a pod of the real cluster (one KRaft node, Debian's Java, Kafka's jars
from the cache mounted from the host), and `up --via kubectl` in front of it: records
produced and consumed with kcat through the tunnel, kubectl -> kube-apiserver -> kubelet ->
containerd -> the pod. A first step towards pods as Strimzi lays them out."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from kafkatunnel.localcluster import free_port_run
from kafkatunnel.localcluster.apache import JIT, kafka_lib
from kafkatunnel.localcluster.kubernetes import JAVA, KubernetesCluster, java_rootfs
from kafkatunnel.localcluster.processes import ManagedProcess
from tests.kube.conftest import KUBECTLS, NEWEST

POD = "kafka-0"
ADVERTISED = f"{POD}.kafka-headless.default.svc.cluster.local"
LABELS = {"app.kubernetes.io/name": "kafka", "app.kubernetes.io/instance": "real"}
SERVER_PROPERTIES = f"""\
process.roles=broker,controller
node.id=0
controller.quorum.voters=0@127.0.0.1:9090
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://0.0.0.0:9092,CONTROLLER://127.0.0.1:9090
advertised.listeners=PLAINTEXT://{ADVERTISED}:9092
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=/tmp/data
num.partitions=3
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
"""
JAVA_OPTIONS = f"-Xms128m -Xmx384m -XX:+UseSerialGC {JIT}"
START = (
    f"printf '%s' \"$SERVER_PROPERTIES\" > /tmp/server.properties && "
    f"java {JAVA_OPTIONS} -cp '/opt/kafka/libs/*' kafka.tools.StorageTool format "
    f"--cluster-id=kafkatunnel-real-k8s0 --config /tmp/server.properties && "
    f"exec java {JAVA_OPTIONS} -cp '/opt/kafka/libs/*' kafka.Kafka /tmp/server.properties"
)


@pytest.fixture(scope="module")
def kafka_pod(kubernetes: KubernetesCluster) -> Iterator[str]:
    """The pod, deleted after this module: its JVM is not to outlive the tests that use it."""
    kubernetes.import_image(java_rootfs(), JAVA)
    kubernetes.run_pod(POD, ["/bin/sh", "-c", START], image=JAVA.name, labels=LABELS,
                       ports={"tcp-clients": 9092}, env={"SERVER_PROPERTIES": SERVER_PROPERTIES},
                       host_paths={"/opt/kafka/libs": kafka_lib()})  # fmt: skip
    yield POD
    kubernetes.delete_pod(POD)


def kcat(*args: str, data: str | None = None) -> str:
    result = subprocess.run(["kcat", *args], input=data, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_up_reaches_kafka_in_a_pod_of_the_real_cluster(
    kubernetes: KubernetesCluster, kafka_pod: str
) -> None:
    port = free_port_run(4)
    env = {
        **os.environ,
        "PATH": f"{os.path.dirname(KUBECTLS[NEWEST])}{os.pathsep}{os.environ['PATH']}",
    }
    up = ManagedProcess(
        [sys.executable, "-m", "kafkatunnel", "up", "--via", "kubectl", "--no-table",
         "--kubeconfig", str(kubernetes.kubeconfig), "-n", "default",
         "--listen", f"127.0.0.1:{port}"],
        name="kafkatunnel-up-real-kubernetes", env=env,
    )  # fmt: skip
    try:
        bootstrap = up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=120)[1]
        topic = f"real-{uuid.uuid4().hex[:6]}"
        records = [f"record-{i}" for i in range(20)]
        produced = "\n".join(records) + "\n"
        kcat("-b", bootstrap, "-t", topic, "-P", "-X", "topic.acks=all", data=produced)
        got = kcat("-b", bootstrap, "-t", topic, "-C", "-e", "-o", "beginning", "-q",
                   "-c", str(len(records)))  # fmt: skip
        assert sorted(got.split()) == sorted(records), up.output()
    finally:
        up.stop()
