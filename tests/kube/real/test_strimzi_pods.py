"""`kafkatunnel up` in front of Apache Kafka in pods of the real cluster, laid out as Strimzi
lays out a Kafka with one node pool of combined KRaft nodes (the `strimzi_kafka` fixture):
every forward goes kubectl -> kube-apiserver -> kubelet -> containerd -> the pod. The pods'
addresses exist only in the cluster's network namespace, so nothing here reaches a broker
except through the tunnel's forwards.

`up` is given no flag that says where Kafka is: its kubeconfig is the cluster's (KUBECONFIG),
whose context's namespace is the Kafka's; it finds Strimzi's broker pods by their labels, the
TLS listener by its port name, the cluster CA and the users' credentials in their secrets."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from confluent_kafka.cimpl import NewTopic

from kafkatunnel.demo import free_port_run
from kafkatunnel.demo.apache import kafka_lib
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.demo.workload import GroupResult, consume_group, produce
from kafkatunnel.probe import ProbeConnection
from kafkatunnel.waiting import DeadlineExceeded, wait_for
from tests.apache.test_clients import java
from tests.kube.conftest import BEFORE_WEBSOCKETS, KUBECTLS, NEWEST
from tests.kube.real.test_rbac import PODS, PORTFORWARD, grant
from tests.worlds.apache import LISTENERS
from tests.worlds.kubernetes import KubernetesCluster
from tests.worlds.strimzi_pods import SCRAM_USER, TLS_USER, StrimziKafka

MESSAGES = 30
CLIENTS = Path(__file__).resolve().parents[2] / "apache" / "clients"  # the Java client
FOUND_WITHIN = 2.0  # seconds from a new broker pod's readiness to a forward reaching it,
# beyond what a new kubectl port-forward takes to answer at that moment


@contextmanager
def up(
    kafka: StrimziKafka, *flags: str, kubectl: str = NEWEST, kubeconfig: Path | None = None
) -> Iterator[tuple[str, ManagedProcess]]:
    """`kafkatunnel up` with the cluster's kubeconfig as the user's own, the real `kubectl`
    of that version first on PATH and `flags` (besides where it listens, and no live table);
    yields the bootstrap.servers it prints."""
    with tempfile.TemporaryDirectory(prefix="kt-kubectl-") as bin_dir:
        (Path(bin_dir) / "kubectl").symlink_to(KUBECTLS[kubectl])
        env = {**os.environ, "KUBECONFIG": str(kubeconfig or kafka.kubeconfig),
               "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
        process = ManagedProcess(
            [sys.executable, "-m", "kafkatunnel", "up", "--no-table",
             "--listen", f"127.0.0.1:{free_port_run(8)}", *flags],
            name="kafkatunnel-up-strimzi-pods", env=env,
        )  # fmt: skip
        try:
            bootstrap = process.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=120)[1]
            yield bootstrap, process
        finally:
            process.stop()


def line(process: ManagedProcess, pattern: str) -> re.Match[str]:
    """The first line of `up`'s output matching `pattern`; failing, what it said."""
    try:
        return process.wait_for_line(pattern, timeout=30)
    except DeadlineExceeded:
        raise AssertionError(f"no /{pattern}/ in:\n{process.output()}") from None


def groups_consume_everything(
    kafka: StrimziKafka, bootstrap: str, config: dict[str, str] | None = None
) -> None:
    """MESSAGES produced with acks=all; then, for each broker, a group it coordinates
    consumes every one of them without a coordinator error."""
    topic = f"strimzi-{uuid.uuid4().hex[:6]}"
    spread = kafka.groups_by_coordinator(1, prefix=f"{topic}-g")
    assert sorted(spread) == [0, 1, 2]
    settings = {"acks": "all", **(config or {})}
    assert produce(bootstrap, topic, MESSAGES, config=settings, timeout=60) == MESSAGES
    for node, (group,) in sorted(spread.items()):
        result = consume_group(bootstrap, group, topic, MESSAGES, timeout=90, config=config,
                               dedupe_by_offset=True)  # fmt: skip
        assert (len(set(result.values)), result.coordinator_errors) == (MESSAGES, []), (
            node, result.errors[:3])  # fmt: skip


@pytest.mark.parametrize("kubectl", list(dict.fromkeys((BEFORE_WEBSOCKETS, NEWEST))))
def test_up_with_no_flags_finds_the_three_brokers_and_groups_on_each_coordinator_consume(
    strimzi_kafka: StrimziKafka, kubectl: str
) -> None:
    """With the newest kubectl (websockets) and the newest from before (SPDY)."""
    with up(strimzi_kafka, kubectl=kubectl) as (bootstrap, process):
        brokers = {n: line(process, rf"^broker {n}: \S+ -> (\S+)")[1]
                   for n in range(3)}  # fmt: skip
        groups_consume_everything(strimzi_kafka, bootstrap)
    plain = LISTENERS["plain"]
    assert brokers == {n: f"{strimzi_kafka.broker_host(n)}:{plain}" for n in range(3)}


def test_tls_trusts_the_cluster_ca_read_from_its_secret(strimzi_kafka: StrimziKafka) -> None:
    """`--tls` alone: the TLS listener found by its port name (tcp-clientstls), the CA in
    my-cluster-cluster-ca-cert; the brokers' certificates name them as Strimzi's do."""
    with up(strimzi_kafka, "--tls") as (bootstrap, process):
        told = line(process, r"^broker 0: \S+ -> (\S+)")[1]
        groups_consume_everything(strimzi_kafka, bootstrap)
    said = " ".join(process.output().split())
    assert told == f"{strimzi_kafka.broker_host(0)}:{LISTENERS['tls']}"
    assert (
        "TLS: trusting the cluster CA of Strimzi cluster my-cluster (secret "
        "my-cluster-cluster-ca-cert, ca.crt)"
    ) in said, said


def test_tls_reads_the_ca_with_get_secrets_and_without_it_stops_naming_it(
    strimzi_kafka: StrimziKafka,
) -> None:
    """RBAC by the real authorizer: `--tls` needs `get` on secrets besides what `up` always
    needs; a user without it is stopped at once, told which permission is missing."""
    from tests.kube.real.test_rbac import PODS, PORTFORWARD, grant

    namespace = strimzi_kafka.namespace
    secrets = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
    without = grant(strimzi_kafka.kube, "tls-no-secrets", [PODS, PORTFORWARD], namespace)
    refused = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "up", "--no-table", "--tls", "-n", namespace,
         "--kubeconfig", str(without.kubeconfig), "--listen", f"127.0.0.1:{free_port_run(8)}"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PATH": f"{Path(KUBECTLS[NEWEST]).parent}{os.pathsep}"
                                   f"{os.environ['PATH']}"},
    )  # fmt: skip
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode != 0, said
    assert (
        f"cannot read secret my-cluster-cluster-ca-cert -n {namespace} (the cluster CA, for "
        "--tls): reading secrets is not allowed (RBAC: get secrets); give it with --tls-ca FILE"
    ) in said, said
    assert "Traceback" not in said, said
    allowed = grant(strimzi_kafka.kube, "tls-secrets", [PODS, PORTFORWARD, secrets], namespace)
    with up(strimzi_kafka, "--tls", "-n", namespace, kubeconfig=allowed.kubeconfig) as (
        bootstrap, _process):  # fmt: skip
        groups_consume_everything(strimzi_kafka, bootstrap)


def test_a_tls_kafka_user_is_presented_to_the_mtls_listener(strimzi_kafka: StrimziKafka) -> None:
    """`--kafka-user bob`: bob's certificate and key from his KafkaUser secret, presented to
    the listener that requires one (9095); clients give no credentials."""
    mtls = str(LISTENERS["mtls"])
    with up(strimzi_kafka, "--tls", "--kafka-user", TLS_USER, "--kafka-port", mtls) as (
        bootstrap, process):  # fmt: skip
        groups_consume_everything(strimzi_kafka, bootstrap)
    said = " ".join(process.output().split())
    assert f"presenting KafkaUser {TLS_USER}'s certificate (secret {TLS_USER})" in said, said
    assert "BEGIN" not in said


def test_a_scram_kafka_users_printed_settings_let_clients_in(strimzi_kafka: StrimziKafka) -> None:
    """`--kafka-user alice` on the SCRAM-over-TLS listener (9094): the tunnel speaks TLS to
    the brokers, clients SASL_PLAINTEXT with the settings `up` prints from alice's secret."""
    scram = str(LISTENERS["scram"])
    with up(strimzi_kafka, "--tls", "--kafka-user", SCRAM_USER, "--kafka-port", scram,
            "--show-password") as (bootstrap, process):  # fmt: skip
        settings = dict(
            line.strip().split("=", 1)
            for line in process.output().splitlines()
            if re.match(r"^  (security\.protocol|sasl\.\w+)=", line)
        )
        assert settings["sasl.username"] == SCRAM_USER, settings
        assert settings["sasl.password"] == strimzi_kafka.scram_password
        groups_consume_everything(strimzi_kafka, bootstrap, settings)


@dataclass
class Load:
    """Records produced with acks=all by an idempotent producer, and a group consuming them,
    while a test does something to the cluster."""

    topic: str
    acked: list[bytes]
    live: GroupResult | None = None  # what the live group read, once stopped

    def wait_acked(self, more: int, what: str) -> None:
        """Until `more` records were acknowledged after now."""
        now = len(self.acked)
        wait_for(lambda: len(self.acked) >= now + more, timeout=120, what=what)


@contextmanager
def under_load(bootstrap: str, prefix: str) -> Iterator[Load]:
    """A new topic of three replicas (min.insync.replicas 2), written and read through the
    tunnel until the block ends; then every acknowledged record must be read by a new group:
    nothing acknowledged was lost."""
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, 3, 3, config={"min.insync.replicas": "2"})
    admin.create_topics([new])[topic].result(60)
    load = Load(topic, [])
    stop = threading.Event()

    def write() -> None:
        producer = confluent_kafka.Producer({
            "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5, "message.timeout.ms": 120000})  # fmt: skip

        def delivered(error: object, message: confluent_kafka.Message) -> None:
            if error is None:
                load.acked.append(message.value() or b"")

        index = 0
        while not stop.is_set():
            producer.produce(topic, f"r-{index}".encode(), on_delivery=delivered)
            producer.poll(0.01)
            index += 1
        producer.flush(60)

    with ThreadPoolExecutor(2) as pool:
        writing = pool.submit(write)
        reading = pool.submit(consume_group, bootstrap, f"{topic}-live", topic, 10**9,
                              timeout=600, stop=stop, dedupe_by_offset=True)  # fmt: skip
        try:  # stopped in any case: a failure here must not leave the threads running
            load.wait_acked(200, "records acknowledged")
            yield load
        finally:
            stop.set()
        writing.result(180)
        load.live = reading.result(180)
    acked = set(load.acked)
    final = consume_group(bootstrap, f"{topic}-after", topic, len(acked), timeout=120)
    lost = acked - set(final.values)
    assert not lost, (len(lost), sorted(lost)[:5], len(acked))
    assert load.live.consumed > 0 and set(load.live.values) <= set(final.values)


@pytest.fixture(scope="module")
def java_client(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The Java client program (tests/apache/clients), compiled against Kafka's own jars;
    its classpath."""
    out = tmp_path_factory.mktemp("java-client")
    lib = kafka_lib()
    subprocess.run(["javac", "-cp", f"{lib}/*", "-d", str(out), str(CLIENTS / "JavaClient.java")],
                   check=True, timeout=180)  # fmt: skip
    return f"{lib}/*:{out}"


def test_the_tunnel_logs_in_as_a_scram_kafka_user_and_clients_need_no_settings(
    strimzi_kafka: StrimziKafka, java_client: str
) -> None:
    """`up --tls --kafka-user alice` on the SCRAM-over-TLS listener (9094): the tunnel reads
    alice's password from her KafkaUser secret and logs in with SCRAM-SHA-512 on every
    connection; librdkafka and a Java consumer given bootstrap.servers and group.id, no
    security setting, consume in groups on every coordinator. The password is not shown."""
    scram = str(LISTENERS["scram"])
    with up(strimzi_kafka, "--tls", "--kafka-user", SCRAM_USER, "--kafka-port", scram) as (
        bootstrap, process):  # fmt: skip
        groups_consume_everything(strimzi_kafka, bootstrap)
        produce_java, consume_java = java(java_client, "classic")
        topic = f"strimzi-java-{uuid.uuid4().hex[:6]}"
        assert produce_java(bootstrap, topic, MESSAGES) == MESSAGES
        spread = strimzi_kafka.groups_by_coordinator(1, prefix=f"{topic}-g")
        consumed = {node: consume_java(bootstrap, topic, group, MESSAGES)
                    for node, (group,) in sorted(spread.items())}  # fmt: skip
        assert consumed == {0: MESSAGES, 1: MESSAGES, 2: MESSAGES}, consumed
    said = " ".join(process.output().split())
    assert f"SASL: the tunnel logs in as KafkaUser {SCRAM_USER} with SCRAM-SHA-512 (secret " \
        f"{SCRAM_USER})" in said, said  # fmt: skip
    assert strimzi_kafka.scram_password not in said


@pytest.mark.parametrize(("rbac", "probed"), [("watch", True), ("listing", True),
                                              ("watch", False)],
                         ids=["watch", "listing", "no-readiness-probe"])  # fmt: skip
def test_a_broker_pod_made_again_with_a_new_ip_loses_nothing_acknowledged(
    strimzi_kafka: StrimziKafka, kubernetes: KubernetesCluster, rbac: str, probed: bool
) -> None:
    """Broker 1's pod deleted (30 s to shut down, as Strimzi gives it) and made again, as a
    StrimziPodSet makes it, with a new pod IP and its volume, while a producer writes with
    acks=all to a topic of three replicas (min.insync.replicas 2) and a group consumes,
    all through one `up` (as the admin, who may watch pods; or as a user whose Role grants
    only get/list pods and create pods/portforward): every acknowledged record is read
    afterwards, and the tunnel's broker 1 answers from the new pod within FOUND_WITHIN of
    its readiness (its probe is Kafka's client port: Ready is Kafka listening), with no
    connection failing after it. Without a readiness probe the pod is Ready long before
    Kafka listens, and the forward fails meanwhile: it is reached within FOUND_WITHIN of
    Kafka listening (a forward to a starting pod never backs off past a second)."""
    before = strimzi_kafka.pod_ips()[1]
    user = (
        None
        if rbac == "watch"
        else grant(
            kubernetes,
            f"lister-{uuid.uuid4().hex[:6]}",
            [PODS, PORTFORWARD],
            strimzi_kafka.namespace,
        )
    )
    flags = () if user is None else ("-n", strimzi_kafka.namespace)
    kubeconfig = None if user is None else user.kubeconfig
    with up(strimzi_kafka, *flags, kubeconfig=kubeconfig) as (
        bootstrap, process,
    ):  # fmt: skip
        local = line(process, r"^broker 1: (\S+) -> ")[1]
        with under_load(bootstrap, "strimzi-moved") as load:
            moved = strimzi_kafka.replace_pod(1, probed=probed)
            name = strimzi_kafka.pod_name(1)
            strimzi_kafka.wait_node_ready(1, timeout=240)
            if not probed:  # Ready already: from the moment Kafka listens in the pod
                ip = moved["status"]["podIP"]

                def listening() -> bool:
                    strimzi_kafka.connect(ip, LISTENERS["plain"]).close()
                    return True

                wait_for(listening, timeout=240, interval=0.1,
                         what=f"Kafka to listen in pod {name}")  # fmt: skip
            errors = broker_errors(bootstrap, 1)
            back = time.monotonic()
            # broker 1's forward reaches the new pod: it answers with the cluster's metadata
            wait_for(lambda: answers(local), timeout=60, interval=0.1,
                     what=f"broker 1 to answer through the tunnel ({local})")  # fmt: skip
            found = time.monotonic() - back
            fresh = a_new_forward_takes(strimzi_kafka, name)
            strimzi_kafka.wait_ready()
            load.wait_acked(200, "records acknowledged after the pod came back")
            assert broker_errors(bootstrap, 1) == errors, process.output()[-3000:]
    after = moved["status"]["podIP"]
    assert after != before, "the pod came back with its old IP: nothing was shown"
    since = "its new pod was ready" if probed else "Kafka listened in its new pod"
    print(f"broker 1 answered through the tunnel {found:.1f}s after {since} ({rbac}); a new "
          f"kubectl port-forward took {fresh:.1f}s to answer; {len(load.acked)} records "
          "acknowledged")  # fmt: skip
    # on a busy machine kubectl itself takes seconds to start: the tunnel's part is the rest
    assert found < FOUND_WITHIN + fresh, f"{found:.1f}s: {process.output()[-3000:]}"


def a_new_forward_takes(kafka: StrimziKafka, pod: str) -> float:
    """Seconds from starting a `kubectl port-forward` to the pod to the broker's first
    answer through it, now: what reaching a pod costs anyone on this machine at the moment
    (a fraction of a second when idle, seconds on a busy one)."""
    began = time.monotonic()
    forward = ManagedProcess([KUBECTLS[NEWEST], "--kubeconfig", str(kafka.kubeconfig),
                              "port-forward", f"pod/{pod}", f":{LISTENERS['plain']}"],
                             name=f"kubectl-port-forward-{pod}")  # fmt: skip
    try:
        port = forward.wait_for_line(r"^Forwarding from 127\.0\.0\.1:(\d+)", timeout=60)[1]
        wait_for(lambda: answers(f"127.0.0.1:{port}"), timeout=60, interval=0.1,
                 what=f"broker {pod} to answer through a new port-forward")  # fmt: skip
        return time.monotonic() - began
    finally:
        forward.stop()


def broker_errors(bootstrap: str, node: int) -> tuple[object, object]:
    """Broker `node`'s failed connections in `status`: how many, and the last one's error."""
    (endpoint,) = [e for e in status(bootstrap)["endpoints"] if e["node_id"] == node]
    return endpoint["errors"], endpoint["last_error"]


@pytest.mark.parametrize("component", ["kubelet", "containerd"])
def test_the_node_killed_under_load_forwards_come_back_and_status_shows_the_drop(
    strimzi_kafka: StrimziKafka, component: str
) -> None:
    """The kubelet (or containerd) killed with SIGKILL and started again, as a node's
    supervisor does, while clients produce with acks=all and consume through `up`: every
    broker answers through the tunnel again, `status` shows each forward's drop with what
    kubectl said, and nothing acknowledged is lost (the pods themselves live on)."""
    with up(strimzi_kafka) as (bootstrap, process):
        local = [line(process, rf"^broker {n}: (\S+) -> ")[1] for n in range(3)]
        with under_load(bootstrap, f"strimzi-{component}") as load:
            strimzi_kafka.kube.kill_and_restart(component)
            for node, address in enumerate(local):
                what = f"broker {node} to answer through the tunnel ({address})"
                wait_for(functools.partial(answers, address), timeout=90, interval=0.25, what=what)
            load.wait_acked(200, f"records acknowledged after the {component} came back")
            endpoints = status(bootstrap)["endpoints"]
    routes = {e["node_id"]: e["route"] for e in endpoints if e["node_id"] is not None}
    assert sorted(routes) == [0, 1, 2], endpoints  # the brokers, not the bootstrap address
    for route in routes.values():
        assert re.search(r"\[\d+ (dropped|replaced); last: ", route), routes
    assert "Traceback" not in process.output(), process.output()[-3000:]


def status(bootstrap: str) -> dict[str, Any]:
    """`kafkatunnel status --json` of the tunnel whose bootstrap address this is."""
    asked = [sys.executable, "-m", "kafkatunnel", "status", "--json",
             "--port", bootstrap.rsplit(":", 1)[1]]  # fmt: skip
    said = subprocess.run(asked, capture_output=True, text=True, timeout=30, check=True)
    answer: dict[str, Any] = json.loads(said.stdout)
    return answer


def answers(address: str) -> bool:
    """Whether the broker behind `address` answers a metadata request with all three."""
    with ProbeConnection(address, timeout=5) as probe:
        return len(probe.brokers()) == 3
