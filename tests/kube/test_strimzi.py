"""TLS credentials from a Strimzi cluster, read with the real kubectl from the API server
stand-in: the cluster CA from `<cluster>-cluster-ca-cert`, a KafkaUser's certificate or
SCRAM settings from its secret, and what `up` says when RBAC does not allow reading them.

The world's pods are the mock cluster's brokers, labelled as Strimzi labels its broker pods;
their ports are reached at 127.0.0.2, where socat's TLS listeners require a client
certificate from the test CA (mTLS, as a Strimzi `tls` listener with `type: tls` users)."""

from __future__ import annotations

import base64
import datetime
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.demo.workload import consume_group, produce
from kafkatunnel.doctor import FAIL, PASS, WARN, StartCheck, check_certificates, check_kubectl
from kafkatunnel.kube.forwarder import KubectlForwarder
from kafkatunnel.kube.kubectl import Kubectl
from kafkatunnel.kube.pods import Pod
from kafkatunnel.kube.strimzi import broker_name, cluster_of, tls_port
from tests.kube.conftest import World, needs_kubectl, says, up
from tests.pki import TestAuthority
from tests.tunnel.tls_front import FRONT_HOST, TlsFront

CLUSTER = "my-cluster"
LABELS = {
    "app.kubernetes.io/name": "kafka",
    "strimzi.io/cluster": CLUSTER,
    "strimzi.io/kind": "Kafka",
    "strimzi.io/name": f"{CLUSTER}-kafka",
}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def strimzi_world(
    world: World,
    cluster: LocalCluster,
    ca: TestAuthority,
    clients: TestAuthority | None = None,
    **changes: Any,
) -> None:
    """Strimzi's pods, its cluster CA secret, a tls KafkaUser alice and a scram one bob.
    As in Strimzi, alice's certificate and her secret's `ca.crt` are the clients CA's
    (`clients`; the cluster CA when None), which does not sign the brokers."""
    clients = clients or ca
    alice = clients.issue("alice", ["alice"], client=True)
    pods = [
        {"name": f"{CLUSTER}-kafka-{i}", "ip": "127.0.0.1", "ports": [b.port], "labels": LABELS,
         "port_names": {str(b.port): "tcp-clientstls"}}
        for i, b in enumerate(cluster.mock)
    ]  # fmt: skip
    secrets = {
        f"{CLUSTER}-cluster-ca-cert": {"ca.crt": _b64(ca.pem.read_bytes())},
        "alice": {
            "ca.crt": _b64(clients.pem.read_bytes()),
            "user.crt": _b64(alice.cert.read_bytes()),
            "user.key": _b64(alice.key.read_bytes()),
        },
        "bob": {"password": _b64(b"bobs-s3cret"), "sasl.jaas.config": _b64(b"...")},
    }
    namespaces = {"default": {"pods": []}, "kafka": {"pods": pods, "secrets": secrets}}
    world(**{"namespaces": namespaces, "pod_address": FRONT_HOST, **changes})


@pytest.fixture
def ca(tmp_path: Path) -> TestAuthority:
    return TestAuthority(tmp_path)


@needs_kubectl
def test_up_reads_the_cluster_ca_and_a_kafka_users_certificate_from_the_cluster(
    cluster: LocalCluster, apiserver: Path, world: World, ca: TestAuthority
) -> None:
    clients = TestAuthority(ca.directory, "strimzi clients CA")
    strimzi_world(world, cluster, ca, clients)
    server = ca.issue("brokers", ["127.0.0.1"])
    with TlsFront(cluster, server, client_ca=clients.pem):
        process = ManagedProcess(
            [
                sys.executable, "-m", "kafkatunnel", "up", "--via", "kubectl",
                "--namespace", "kafka", "--bootstrap", cluster.mock[0].address,
                "--listen", f"127.0.0.1:{free_port_run(8)}",
                "--no-table", "--tls", "--kafka-user", "alice",
            ],
            name="kafkatunnel-up-strimzi",
        )  # fmt: skip
        try:
            bootstrap = process.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=60).group(1)
            topic = f"strimzi-{uuid.uuid4().hex[:6]}"
            assert produce(bootstrap, topic, 10) == 10
            assert consume_group(bootstrap, f"{topic}-g", topic, 10, timeout=60).consumed == 10
        finally:
            process.stop()
    said = " ".join(process.output().split())
    assert f"trusting the cluster CA of Strimzi cluster {CLUSTER}" in said, said
    assert "presenting KafkaUser alice's certificate" in said, said
    assert "BEGIN" not in said  # no key or certificate on screen


@needs_kubectl
def test_without_get_secrets_up_names_the_secret_and_the_flag(
    cluster: LocalCluster, apiserver: Path, world: World, ca: TestAuthority
) -> None:
    strimzi_world(world, cluster, ca, forbidden=["get secrets"])
    result = up("--namespace", "kafka", "--bootstrap", cluster.mock[0].address, "--tls")
    says(
        result,
        f"cannot read secret {CLUSTER}-cluster-ca-cert -n kafka (the cluster CA, for --tls)",
        "reading secrets is not allowed (RBAC: get secrets)",
        "give it with --tls-ca FILE",
    )
    assert "Traceback" not in result.stderr


@needs_kubectl
def test_a_scram_kafka_user_gets_its_client_settings_and_the_password_only_when_asked(
    cluster: LocalCluster, apiserver: Path, world: World, ca: TestAuthority
) -> None:
    """--show-password: the tunnel does not log in; up prints the settings clients log in
    with themselves, the password among them."""
    strimzi_world(world, cluster, ca, pod_address="127.0.0.1")  # the plaintext listeners
    process = ManagedProcess(
        [
            sys.executable, "-m", "kafkatunnel", "up", "--via", "kubectl", "--namespace", "kafka",
            "--bootstrap", cluster.mock[0].address, "--listen", f"127.0.0.1:{free_port_run(8)}",
            "--no-table", "--kafka-user", "bob", "--show-password",
        ],
        name="kafkatunnel-up-scram",
    )  # fmt: skip
    try:
        process.wait_for_line(r"^bootstrap\.servers=", timeout=60)
    finally:
        process.stop()
    said = process.output()
    for line in ("sasl.mechanism=SCRAM-SHA-512", "sasl.username=bob",
                 "security.protocol=SASL_PLAINTEXT", "sasl.password=bobs-s3cret"):  # fmt: skip
        assert line in said, said
    assert "the tunnel logs in" not in said.split("without --show-password")[0], said


@needs_kubectl
def test_a_scram_kafka_users_password_is_the_tunnels_to_log_in_with_never_shown(
    cluster: LocalCluster, apiserver: Path, world: World, ca: TestAuthority
) -> None:
    """Without --show-password the tunnel logs in as bob with his secret's password: the
    mock cluster's listener takes no login, which up says at start, naming bob and the
    mechanism; the password is not printed."""
    strimzi_world(world, cluster, ca, pod_address="127.0.0.1")
    result = up("--namespace", "kafka", "--bootstrap", cluster.mock[0].address,
                "--listen", f"127.0.0.1:{free_port_run(8)}", "--kafka-user", "bob")  # fmt: skip
    says(
        result,
        "SASL: the tunnel logs in as KafkaUser bob with SCRAM-SHA-512 (secret bob); clients "
        "need no credentials of their own",
        "the tunnel cannot log in: broker",
        "login as bob with SCRAM-SHA-512 failed: the broker offers no SaslAuthenticate",
    )
    assert "bobs-s3cret" not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_strimzi_pods_give_the_tls_port_and_the_names_their_certificates_carry() -> None:
    pods = [
        Pod(f"{CLUSTER}-kafka-{i}", "10.0.0.1", (9092, 9093), True, namespace="shop",
            labels=tuple(sorted(LABELS.items())), named_ports=(("tcp-clientstls", 9093),))
        for i in range(2)
    ]  # fmt: skip
    assert cluster_of(pods) == CLUSTER and tls_port(pods) == 9093
    assert broker_name(pods[1], CLUSTER) == f"{CLUSTER}-kafka-1.{CLUSTER}-kafka-brokers.shop.svc"
    other = Pod("kafka-0", "10.0.0.2", (9092,), True, labels=(("app", "kafka"),))
    assert cluster_of([other]) is None and tls_port([other]) is None


@needs_kubectl
@pytest.mark.parametrize("may_read", [True, False])
def test_doctor_says_whether_up_can_read_the_cluster_ca(
    cluster: LocalCluster, apiserver: Path, world: World, ca: TestAuthority, may_read: bool
) -> None:
    strimzi_world(world, cluster, ca, forbidden=[] if may_read else ["get secrets"])
    forwarder = KubectlForwarder(Kubectl(namespace="kafka"))
    results = {r.check: r for r in check_kubectl(forwarder.kubectl, StartCheck(forwarder))}
    secrets = results["RBAC: get secrets"]
    if may_read:
        assert secrets.status == PASS and f"{CLUSTER}-cluster-ca-cert" in secrets.detail
    else:
        assert secrets.status == WARN and "--tls-ca FILE" in secrets.fix
        assert f"kubectl get secret {CLUSTER}-cluster-ca-cert -n kafka" in secrets.fix


def test_doctor_warns_of_a_broker_certificate_expiring_within_two_weeks() -> None:
    now = datetime.datetime(2026, 11, 25, tzinfo=datetime.UTC)

    def endpoint(node: int | None, days: float) -> dict[str, Any]:
        expires = (now + datetime.timedelta(days=days)).isoformat()
        return {"node_id": node, "advertised": f"kafka-{node}:9093", "tls": {"expires": expires}}

    status = {"endpoints": [endpoint(None, 3), endpoint(0, 40), endpoint(1, 3), endpoint(2, -1)]}
    results = {r.check: r for r in check_certificates(status, now)}
    assert results["certificate of kafka-0:9093"].status == PASS
    assert results["certificate of kafka-1:9093"].status == WARN
    assert "expires in 3 days" in results["certificate of kafka-1:9093"].detail
    assert results["certificate of kafka-2:9093"].status == FAIL
    assert len(results) == 3  # the bootstrap listener is one of the brokers: not twice
    assert check_certificates({"endpoints": [{"node_id": 0, "tls": None}]}, now) == []


def test_a_cluster_label_that_is_no_object_name_is_not_used() -> None:
    """The label comes from the cluster: it names a secret and a kubectl argument only when
    it is a Kubernetes object name."""
    for label in ("--all-namespaces", "my/../cluster", "a b", "X" * 70):
        pod = Pod("p-0", "10.0.0.1", (9093,), True, labels=(("strimzi.io/cluster", label),))
        assert cluster_of([pod]) is None, label
