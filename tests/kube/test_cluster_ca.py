"""The cluster CA of Confluent for Kubernetes and of Bitnami's chart, read with the real
kubectl from the API server stand-in (Strimzi's is in test_strimzi.py): the world's pods are
the mock cluster's brokers, labelled as each distribution labels them, their ports behind
socat's TLS listeners at 127.0.0.2 with certificates from a test CA that only the world's
secrets hold."""

from __future__ import annotations

import base64
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.demo.workload import consume_group, produce
from kafkatunnel.kube import cluster_ca
from kafkatunnel.kube.cluster_ca import CaSource
from kafkatunnel.kube.pods import Pod
from tests.kube.conftest import World, needs_kubectl, says, up
from tests.pki import TestAuthority
from tests.tunnel.tls_front import FRONT_HOST, TlsFront

BITNAMI = {"app.kubernetes.io/name": "kafka", "app.kubernetes.io/instance": "shop",
           "app.kubernetes.io/component": "broker"}  # fmt: skip
CFK = {"app": "kafka", "platform.confluent.io/type": "kafka", "type": "kafka"}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def distribution_world(
    world: World, cluster: LocalCluster, ca: TestAuthority, kind: str, **changes: Any
) -> None:
    """The brokers as `kind` deploys them, and its secrets: Bitnami's `<fullname>-tls`
    (mounted, `ca.crt`), or Confluent for Kubernetes' `ca-pair-sslcerts` (`tls.crt`, not
    mounted) beside the brokers' own mounted certificates (no CA in them)."""
    pem = _b64(ca.pem.read_bytes())
    if kind == "bitnami":
        labels, mounted = BITNAMI, ["shop-kafka-tls"]
        secrets = {"shop-kafka-tls": {"ca.crt": pem, "tls.crt": pem, "tls.key": _b64(b"k")}}
    else:
        labels, mounted = CFK, ["kafka-generated-jks"]
        secrets = {cluster_ca.CFK_CA_PAIR: {"tls.crt": pem, "tls.key": "a2V5"},
                   "kafka-generated-jks": {"keystore.jks": "eA=="}}  # fmt: skip
    pods = [{"name": f"kafka-{i}", "ip": "127.0.0.1", "ports": [b.port], "labels": labels,
             "secrets": mounted} for i, b in enumerate(cluster.mock)]  # fmt: skip
    namespaces = {"default": {"pods": []}, "kafka": {"pods": pods, "secrets": secrets}}
    world(**{"namespaces": namespaces, "pod_address": FRONT_HOST, **changes})


@needs_kubectl
@pytest.mark.parametrize("kind", ["bitnami", "cfk"])
def test_up_tls_trusts_the_ca_the_distribution_keeps_in_its_secrets(
    cluster: LocalCluster, apiserver: Path, world: World, tmp_path: Path, kind: str
) -> None:
    ca = TestAuthority(tmp_path)
    distribution_world(world, cluster, ca, kind)
    with TlsFront(cluster, ca.issue("brokers", ["127.0.0.1"])):
        process = ManagedProcess(
            [sys.executable, "-m", "kafkatunnel", "up", "--via", "kubectl", "--namespace",
             "kafka", "--bootstrap", cluster.mock[0].address, "--listen",
             f"127.0.0.1:{free_port_run(8)}", "--no-table", "--tls"],
            name=f"kafkatunnel-up-{kind}",
        )  # fmt: skip
        try:
            bootstrap = process.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=60)[1]
            topic = f"{kind}-{uuid.uuid4().hex[:6]}"
            assert produce(bootstrap, topic, 10) == 10
            assert consume_group(bootstrap, f"{topic}-g", topic, 10, timeout=60).consumed == 10
        finally:
            process.stop()
    said = " ".join(process.output().split())
    secret = {"bitnami": "shop-kafka-tls, ca.crt", "cfk": "ca-pair-sslcerts, tls.crt"}[kind]
    assert "TLS: trusting the cluster CA of" in said and f"(secret {secret})" in said, said


@needs_kubectl
def test_without_a_ca_in_the_pods_secrets_up_trusts_the_system_and_says_so(
    cluster: LocalCluster, apiserver: Path, world: World, tmp_path: Path
) -> None:
    ca = TestAuthority(tmp_path)
    distribution_world(world, cluster, ca, "bitnami")
    world_text = apiserver.read_text().replace('"ca.crt"', '"other.crt"')
    apiserver.write_text(world_text)  # the mounted secret holds no CA
    with TlsFront(cluster, ca.issue("brokers", ["127.0.0.1"])):
        result = up("--namespace", "kafka", "--bootstrap", cluster.mock[0].address, "--tls",
                    "--start-timeout", "5")  # fmt: skip
    says(
        result,
        "no cluster CA found in the broker pods' secrets (shop-kafka-tls): trusting the system's",
        "unable to get local issuer certificate",
        "--tls-ca",
    )


@needs_kubectl
def test_without_get_secrets_up_names_the_distributions_secret(
    cluster: LocalCluster, apiserver: Path, world: World, tmp_path: Path
) -> None:
    distribution_world(world, cluster, TestAuthority(tmp_path), "cfk", forbidden=["get secrets"])
    result = up("--namespace", "kafka", "--bootstrap", cluster.mock[0].address, "--tls")
    says(result, "cannot read secret ca-pair-sslcerts -n kafka (the cluster CA, for --tls)",
         "reading secrets is not allowed", "give it with --tls-ca FILE")  # fmt: skip


def pod(labels: dict[str, str], secrets: tuple[str, ...]) -> Pod:
    return Pod("kafka-0", "10.0.0.1", (9093,), True, labels=tuple(sorted(labels.items())),
               secrets=secrets)  # fmt: skip


def test_where_each_distribution_keeps_its_ca() -> None:
    strimzi = {"strimzi.io/cluster": "my-cluster", "strimzi.io/kind": "Kafka"}
    assert cluster_ca.sources([pod(strimzi, ("anything",))]) == [
        CaSource("my-cluster-cluster-ca-cert", "ca.crt", "Strimzi cluster my-cluster")
    ]
    assert [(s.secret, s.key) for s in cluster_ca.sources([pod(CFK, ("mine-tls",))])] == [
        ("ca-pair-sslcerts", "tls.crt"), ("mine-tls", "cacerts.pem")
    ]  # fmt: skip
    assert [(s.secret, s.key) for s in cluster_ca.sources([pod(BITNAMI, ("shop-kafka-tls",))])] == [
        ("shop-kafka-tls", "ca.crt")
    ]  # fmt: skip
    assert cluster_ca.sources([pod(BITNAMI, ())]) == []


def test_secret_names_from_the_pods_are_used_only_when_they_are_object_names() -> None:
    hostile = ("--kubeconfig=/tmp/x", "a b", "UPPER", "../etc", "x/y", "ok-tls", "", "a.b-c")
    found = cluster_ca.sources([pod(BITNAMI, hostile)])
    assert [s.secret for s in found] == ["a.b-c", "ok-tls"]
