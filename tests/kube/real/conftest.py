"""One real Kubernetes for every test that needs it (tests/worlds/kubernetes.py):
etcd, kube-apiserver, the kubelet and containerd in a network namespace of their own, reached
by the host's kubectl through a relay on loopback. Its first pod is an echo server. They all
live in this package, so the cluster and its Kafka pods stop as soon as these tests end, not
idling beside the rest of the suite (0.13 of a core, the three brokers most of it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafkatunnel.demo import isolation_problem
from tests.worlds.kubernetes import KubernetesCluster
from tests.worlds.strimzi_pods import StrimziKafka

ECHO_PORT = 7000
ECHO = ["/bin/busybox", "nc", "-ll", "-p", str(ECHO_PORT), "-e", "/bin/busybox", "cat"]


@pytest.fixture(scope="package")
def kubernetes() -> Iterator[KubernetesCluster]:
    """The one-node cluster, started once; after it stopped, nothing of it is left."""
    problem = isolation_problem()
    if problem:
        pytest.skip(f"needs network isolation, which is unavailable: {problem}")
    cluster = KubernetesCluster(streaming_idle_timeout="30s")
    with cluster:
        yield cluster
    left = cluster.leftovers()
    assert not left, f"the cluster left behind: {left}"


@pytest.fixture(scope="package")
def echo_pod(kubernetes: KubernetesCluster) -> str:
    """A pod whose port 7000 sends back what it gets; its name."""
    kubernetes.run_pod("echo", ECHO, ports={"echo": ECHO_PORT}, labels={"app": "echo"})
    return "echo"


@pytest.fixture(scope="package")
def strimzi_kafka(kubernetes: KubernetesCluster) -> Iterator[StrimziKafka]:
    """Three Apache Kafka nodes in pods of the cluster, as Strimzi lays out a Kafka with one
    node pool of combined nodes (tests/worlds/strimzi_pods.py), in namespace
    kafka; started once, shared by the tests that use it."""
    with StrimziKafka(kubernetes) as kafka:
        yield kafka
