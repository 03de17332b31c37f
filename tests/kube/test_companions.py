"""The services beside the brokers, reached with the real kubectl through the API server
stand-in: a Schema Registry (Bitnami's labels, a named targetPort) and a Strimzi KafkaConnect's
`-connect-api` service, each a pod whose HTTP server (tests/kube/http_service.py) runs in
the cluster's network namespace beside the mock brokers.

`up --companions` finds both, serves each on a loopback port and, with --dns, on its own
loopback address and original port under its in-cluster names. A real SchemaRegistryClient
registers and reads schemas through it; Connect's REST API answers; its pod is replaced
while a client polls.

The real Kafka Connect and Apicurio Registry, and real records through them, are in
tests/apache/test_companions.py. The HTTP server here stays where the subject is the
forward, not the service, and each test says why it needs it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kafkatunnel.cli.companions import READ_ONLY_NOTE
from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.demo.netns import NetworkNamespace
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.doctor import PASS, StartCheck, check_kubectl
from kafkatunnel.kube.forwarder import KubectlForwarder
from kafkatunnel.kube.kubectl import Kubectl
from kafkatunnel.kube.service_forwarder import ServiceForwarder
from kafkatunnel.tunnel.control import fetch
from kafkatunnel.waiting import wait_for
from tests.kube.conftest import APISERVER, KUBECTLS, NEWEST, kubeconfig, needs_kubectl, says, up

SERVICE = Path(__file__).with_name("http_service.py")
REGISTRY = {"app.kubernetes.io/name": "schema-registry", "app.kubernetes.io/instance": "shop"}
CONNECT = {"strimzi.io/kind": "KafkaConnect", "strimzi.io/cluster": "shop-connect",
           "strimzi.io/name": "shop-connect-connect"}  # fmt: skip
SCHEMA = '{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}'
IN_CLUSTER = "http://schema-registry.shop.svc.cluster.local:8081"


def shop_world(
    path: Path, registry_pod: str = "schema-registry-7c9d-a", ready: bool = True
) -> None:
    """The world's Kafka namespace becomes "shop", with a Schema Registry and a Connect
    cluster beside the brokers."""
    world = json.loads(path.read_text())
    spaces = world["namespaces"]
    shop = spaces.pop("kafka", None) or spaces["shop"]
    shop["pods"] = [p for p in shop["pods"] if p["name"].startswith("kafka-")] + [
        {"name": registry_pod, "ip": "127.0.0.1", "ports": [8081], "labels": REGISTRY,
         "port_names": {"8081": "http"}, "ready": ready},
        {"name": "shop-connect-connect-0", "ip": "127.0.0.1", "ports": [8083], "labels": CONNECT},
    ]  # fmt: skip
    shop["services"].update({
        "schema-registry": {"selector": REGISTRY, "labels": REGISTRY,
                            "ports": [{"name": "http", "port": 8081, "targetPort": "http"}]},
        "shop-connect-connect-api": {"selector": CONNECT, "labels": CONNECT,
                                     "ports": [{"name": "rest-api", "port": 8083,
                                                "targetPort": 8083}]},
        "unrelated": {"selector": {"app": "web"}, "labels": {"app": "web"},
                      "ports": [{"port": 80, "targetPort": 8080}]},
        # endpoints set by hand (an issuer outside the cluster): kubectl cannot forward it
        "keycloak": {"selector": {}, "labels": {"app": "keycloak"}, "ports": [{"port": 8080}]},
    })  # fmt: skip
    spaces["shop"] = shop
    path.write_text(json.dumps(world))


def pod(cluster: LocalCluster, kind: str, port: int, name: str) -> ManagedProcess:
    """A pod's HTTP server in the cluster's network namespace, serving."""
    assert cluster.namespace is not None
    server = ManagedProcess([*cluster.namespace.exec_prefix(), sys.executable, str(SERVICE),
                             kind, str(port), name], name=name)  # fmt: skip
    server.wait_for_line(r"^serving on ", timeout=30)
    return server


def get(url: str, timeout: float = 5.0) -> tuple[str, Any]:
    """The pod that answered and its JSON answer."""
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return str(answer.headers["X-Pod"]), json.loads(answer.read())


def route_of(env: dict[str, str], name: str) -> str:
    """The forward of a service beside the brokers, as `status --json` describes it."""
    asked = [sys.executable, "-m", "kafkatunnel", "status", "--json"]
    status = json.loads(subprocess.run(asked, capture_output=True, text=True, timeout=30,
                                       env=env, check=True).stdout)  # fmt: skip
    return str(next(c for c in status["companions"] if c["name"] == name)["route"])


def registry_round_trip(url: str) -> None:
    """The real SchemaRegistryClient registers a schema and reads it back by id."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": url})
    schema_id = client.register_schema("orders-value", Schema(SCHEMA, "AVRO"))
    assert json.loads(str(client.get_schema(schema_id).schema_str)) == json.loads(SCHEMA)
    assert "orders-value" in client.get_subjects()


@needs_kubectl
def test_up_companions_serves_registry_and_connect_and_follows_a_pod_restart(
    cluster: LocalCluster, apiserver: Path, tmp_path: Path
) -> None:
    """The stand-in, because the gap is measured from the old pod's last answer to the new
    pod's first, and only an answer that names its pod (X-Pod) tells them apart; the real
    Connect's pod replacement is in tests/apache/test_companions.py."""
    shop_world(apiserver)
    servers = [pod(cluster, "schema-registry", 8081, "schema-registry-7c9d-a"),
               pod(cluster, "connect", 8083, "shop-connect-connect-0")]  # fmt: skip
    env = {**os.environ, "KAFKATUNNEL_STATE_DIR": str(tmp_path / "state")}
    tunnel = ManagedProcess(
        [sys.executable, "-m", "kafkatunnel", "up", "--via", "kubectl", "-n", "shop",
         "--listen", f"127.0.0.1:{free_port_run(8)}", "--no-table", "--companions"],
        name="kafkatunnel-up-companions", env=env,
    )  # fmt: skip
    try:
        registry = tunnel.wait_for_line(r"^schema\.registry\.url=(\S+)$", timeout=60)[1]
        connect = tunnel.wait_for_line(r"^connect: (\S+) ", timeout=10)[1]
        assert registry.startswith("http://127.0.0.1:"), registry
        assert "note: keycloak keycloak is not forwarded: service keycloak has no selector" in (
            tunnel.output()
        )
        registry_round_trip(registry)
        assert get(f"{connect}/connectors") == ("shop-connect-connect-0", [])
        assert get(connect)[1]["version"] == "3.9.0"

        status = json.loads(subprocess.run(
            [sys.executable, "-m", "kafkatunnel", "status", "--json"],
            capture_output=True, text=True, timeout=30, env=env, check=True).stdout)  # fmt: skip
        listed = {c["name"]: c for c in status["companions"]}
        assert set(listed) == {"schema-registry", "shop-connect-connect-api"}, listed
        served = listed["schema-registry"]
        assert served["kind"] == "schema-registry" and served["state"] == "listening"
        assert "pod/schema-registry-7c9d-a :8081" in served["route"], served
        assert "(ready)" in served["route"] and served["total_connections"] >= 3, served
        assert served["bytes_in"] > 0 and served["bytes_out"] > 0, served
        assert listed["shop-connect-connect-api"]["kind"] == "connect"
        metrics = fetch(status["control"], "/metrics")
        labels = f'service="schema-registry:8081",tunnel="{served["tunnel"]}"'
        counted = f"kafkatunnel_service_connections_total{{{labels}}} "
        assert int(metrics.split(counted, 1)[1].split()[0]) >= 3, metrics
        asked = [sys.executable, "-m", "kafkatunnel", "status"]
        table = subprocess.run(asked, capture_output=True, text=True, timeout=30, env=env).stdout
        assert "schema-registry.shop:8081" in table and "pod/schema-registry-7c9d-a" in table

        # The Deployment replaces the registry's pod while a client polls it.
        answered: list[tuple[float, str]] = []  # when each answer came, and from which pod
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                    by = get(f"{registry}/subjects", 10)[0]
                    answered.append((time.monotonic(), by))  # when the answer came
                time.sleep(0.05)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            wait_for(lambda: len(answered) >= 5, timeout=10, what="the poller to be answered")
            shop_world(apiserver, registry_pod="schema-registry-7c9d-b", ready=False)
            servers[0].stop()
            Path(f"{apiserver}.lost-schema-registry-7c9d-a").touch()  # the pod is gone
            # the new pod runs, not ready yet, until the tunnel has found it so
            wait_for(lambda: "restarting" in route_of(env, "schema-registry"), timeout=10,
                     what="the tunnel to find the new pod not ready")  # fmt: skip
            servers[0] = pod(cluster, "schema-registry", 8081, "schema-registry-7c9d-b")
            shop_world(apiserver, registry_pod="schema-registry-7c9d-b")
            wait_for(lambda: answered[-1][1] == "schema-registry-7c9d-b", timeout=15,
                     what="the new pod to answer")  # fmt: skip
        finally:
            stop.set()
            poller.join(timeout=15)
        # the longest time without an answer, from the old pod's last to the new pod's first:
        # printed, not asserted (a wall-clock bound fails on a loaded machine, not on a fault)
        gap = max(later[0] - earlier[0] for earlier, later in itertools.pairwise(answered))
        print(f"longest time without an answer while the pod was replaced: {gap:.2f}s")
    finally:
        tunnel.stop()
        for server in servers:
            server.stop()
    assert "Traceback" not in tunnel.output()


@needs_kubectl
def test_a_service_resolves_by_its_in_cluster_names_through_unbound_in_front_of_the_shim(
    cluster: LocalCluster, world: Any, certificate: tuple[Path, Path], tmp_path: Path
) -> None:
    """A laptop (its own network namespace) whose resolv.conf names unbound, which sends
    the cluster's zones to the shim; the API server stand-in and kubectl run there too.
    The subject is which names resolve (the short forms, a TLD that is somebody else's),
    so the stand-in serves; the real services by their in-cluster URLs are in
    tests/apache/test_companions.py."""
    from tests.dns.test_real_resolvers import RESOLV_CONF, SHIM, unbound

    path = world()
    shop_world(path)
    servers = [pod(cluster, "schema-registry", 8081, "schema-registry-7c9d-a"),
               pod(cluster, "connect", 8083, "shop-connect-connect-0")]  # fmt: skip
    cert, key = certificate
    with NetworkNamespace(resolv_conf=RESOLV_CONF) as laptop:
        port = 6443
        api = ManagedProcess([*laptop.exec_prefix(), sys.executable, str(APISERVER), str(path),
                              str(port), str(cert), str(key)], name="apiserver")  # fmt: skip
        resolver = None
        config = tmp_path / "kubeconfig"
        config.write_text(kubeconfig(port, cert))
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "kubectl").symlink_to(KUBECTLS[NEWEST])
        env = {**os.environ, "KUBECONFIG": str(config), "KUBECACHEDIR": str(tmp_path / "cache"),
               "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               "KAFKATUNNEL_STATE_DIR": str(tmp_path / "state")}  # fmt: skip
        tunnel = ManagedProcess(
            [*laptop.exec_prefix(), sys.executable, "-m", "kafkatunnel", "up", "--via",
             "kubectl", "-n", "shop", "--no-table", "--companions",
             "--dns", "--dns-listen", f"{SHIM[0]}:{SHIM[1]}", "--dns-setup", "none"],
            name="laptop-tunnel", env=env,
        )  # fmt: skip
        try:
            api.wait_for_line(r"^serving on ", timeout=30)
            said = tunnel.wait_for_line(r"^schema\.registry\.url=(\S+)$", timeout=60)[1]
            assert said == IN_CLUSTER, tunnel.output()
            asked = [*laptop.exec_prefix(), sys.executable, "-m", "kafkatunnel", "status", "--json"]
            status = json.loads(subprocess.run(asked, capture_output=True, text=True, timeout=30,
                                               env=env, check=True).stdout)  # fmt: skip
            served = next(c for c in status["companions"] if c["name"] == "schema-registry")
            resolver = ManagedProcess([*laptop.exec_prefix(),
                                       *unbound(tmp_path, status["dns"]["zones"])],
                                      name="unbound")  # fmt: skip

            def resolve(name: str) -> str | None:
                asked = [*laptop.exec_prefix(), "getent", "hosts", name]
                found = subprocess.run(asked, capture_output=True, text=True, timeout=30).stdout
                return found.split()[0] if found else None

            full = "schema-registry.shop.svc.cluster.local"
            wait_for(lambda: resolve(full), timeout=20, what="unbound to answer")
            for name in ("schema-registry.shop.svc", full):
                assert resolve(name) == served["dns_address"], name
            # a short form is outside the zones: /etc/hosts' to hold, no domain of the shim's
            assert resolve("schema-registry") != served["dns_address"]
            assert resolve("other.shop.svc.cluster.local") is None
            # `.shop` is a TLD: `schema-registry.shop` is somebody's name on the internet
            assert resolve("schema-registry.shop") != served["dns_address"]
            # the real client, by the in-cluster URL, on the laptop
            client = subprocess.run(
                [*laptop.exec_prefix(), sys.executable, "-c",
                 "import sys; from tests.kube.test_companions import registry_round_trip; "
                 "registry_round_trip(sys.argv[1]); print('ROUND TRIP')", IN_CLUSTER],
                capture_output=True, text=True, timeout=60, env=env,
                cwd=Path(__file__).resolve().parents[2],
            )  # fmt: skip
            assert client.stdout.strip() == "ROUND TRIP", client.stderr[-3000:]
            connect = "http://shop-connect-connect-api.shop.svc.cluster.local:8083/connectors"
            listed = subprocess.run(
                [*laptop.exec_prefix(), "curl", "-sf", "-D", "-", connect],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert "X-Pod: shop-connect-connect-0" in listed.stdout, listed
            assert listed.stdout.rstrip().endswith("[]"), listed.stdout
        finally:
            tunnel.stop()
            if resolver is not None:
                resolver.stop()
            api.stop()
            for server in servers:
                server.stop()


@pytest.mark.parametrize(
    ("args", "phrases"),
    [
        (["--service", "Schema_Registry"], ["is not a Kubernetes service name"]),
        (["--service", "schema-registry:http"], ["PORT 'http' is not a port"]),
        (["--service", "schema-registry=0"], ["LOCALPORT '0' is not a port"]),
        (["--service", "a", "--service", "a"], ["service a is named twice"]),
    ],
)
def test_service_mistakes_are_named_before_anything_runs(
    args: list[str], phrases: list[str]
) -> None:
    says(up("--bootstrap", "kafka-0:9092", *args), *phrases)


@needs_kubectl
def test_a_service_that_is_not_there_or_has_no_such_port_is_named(
    cluster: LocalCluster, apiserver: Path
) -> None:
    shop_world(apiserver)
    result = up("-n", "shop", "--service", "schema-regsitry", "--start-timeout", "5")
    says(result, '--service schema-regsitry: no service "schema-regsitry" in shop')
    result = up("-n", "shop", "--service", "schema-registry:9999")
    says(result, "service schema-registry has no port 9999 (it has 8081)")
    with socket.socket() as holder:  # a local port someone else holds stops up, naming it
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        result = up("-n", "shop", "--service", f"schema-registry={taken}",
                    "--listen", f"127.0.0.1:{free_port_run(8)}")  # fmt: skip
    says(
        result,
        f"port {taken} on 127.0.0.1 is already in use by python",
        "choose another with --service schema-registry:8081=LOCALPORT",
    )


@needs_kubectl
def test_a_service_forward_alive_but_useless_is_found_by_an_http_request_and_replaced(
    cluster: LocalCluster, apiserver: Path, tmp_path: Path
) -> None:
    """kubectl#686 on a service's forward: new streams get no reply. A client's request
    goes unanswered, so the tunnel asks the service over HTTP, gets no answer either, and
    replaces the forward; clients are answered again. The stand-in answers at once and
    names its pod, so the only silence is the forward's."""
    shop_world(apiserver)
    server = pod(cluster, "schema-registry", 8081, "schema-registry-7c9d-a")
    env = {**os.environ, "KAFKATUNNEL_STATE_DIR": str(tmp_path / "state")}
    tunnel = ManagedProcess(
        [sys.executable, "-m", "kafkatunnel", "up", "--via", "kubectl", "-n", "shop",
         "--listen", f"127.0.0.1:{free_port_run(8)}", "--no-table",
         "--service", "schema-registry"],
        name="kafkatunnel-up-zombie-service", env=env,
    )  # fmt: skip

    def answered() -> bool:
        try:
            return get(f"{registry}/subjects", timeout=10)[0] == "schema-registry-7c9d-a"
        except (OSError, urllib.error.URLError, ValueError):
            return False

    try:
        registry = tunnel.wait_for_line(r"^schema\.registry\.url=(\S+)$", timeout=60)[1]
        assert answered()
        Path(f"{apiserver}.zombie-schema-registry-7c9d-a").write_text("timeout")
        wait_for(lambda: not Path(f"{apiserver}.zombie-schema-registry-7c9d-a").exists(),
                 timeout=10, what="the API server to take the fault")  # fmt: skip
        wait_for(answered, timeout=40, what="answers through a new forward")
        status = json.loads(subprocess.run(
            [sys.executable, "-m", "kafkatunnel", "status", "--json"],
            capture_output=True, text=True, timeout=30, env=env, check=True).stdout)  # fmt: skip
        (served,) = status["companions"]
        assert "[1 replaced; last: no answer to an HTTP request within 5s" in served["route"]
    finally:
        tunnel.stop()
        server.stop()


@needs_kubectl
def test_doctor_lists_the_companions_up_would_forward(
    cluster: LocalCluster, apiserver: Path
) -> None:
    shop_world(apiserver)
    kubectl = Kubectl(namespace="shop")
    results = {r.check: r for r in check_kubectl(kubectl, StartCheck(KubectlForwarder(kubectl)))}
    found = results["companions"]
    assert found.status == PASS, found
    assert found.detail == (
        "schema-registry schema-registry:8081, connect shop-connect-connect-api:8083: "
        "up --companions forwards them"
    )


@needs_kubectl
def test_containers_reach_the_companions_on_the_bridge(
    cluster: LocalCluster, apiserver: Path, tmp_path: Path
) -> None:
    """--for-containers: the registry is served on the bridge too, on the same port, and
    `up` prints the URL containers use; a SchemaRegistryClient in the container uses it.
    The container is a veth namespace as Docker makes one, in this package's world of
    stand-ins; Docker's engine runs the recipes in tests/docker/. The subject here is the
    bridge's listener and the URL printed for it."""
    from tests.tunnel.container import HOST_ADDRESS, Container

    shop_world(apiserver)
    server = pod(cluster, "schema-registry", 8081, "schema-registry-7c9d-a")
    with Container() as box:
        tunnel = ManagedProcess(
            [sys.executable, "-m", "kafkatunnel", "up", "--via", "kubectl", "-n", "shop",
             "--listen", f"127.0.0.1:{free_port_run(8)}", "--no-table",
             "--service", "schema-registry", "--for-containers",
             "--container-network", box.bridge],
            name="kafkatunnel-up-companions-containers",
            env={**os.environ, "KAFKATUNNEL_STATE_DIR": str(tmp_path / "state")},
        )  # fmt: skip
        try:
            here = tunnel.wait_for_line(r"^schema\.registry\.url=(\S+)$", timeout=60)[1]
            there = tunnel.wait_for_line(r"^containers: schema\.registry\.url=(\S+)$",
                                         timeout=10)[1]  # fmt: skip
            assert there == f"http://{HOST_ADDRESS}:{here.rsplit(':', 1)[1]}", (here, there)
            client = box.python(
                "-c", "import sys; from tests.kube.test_companions import registry_round_trip; "
                "registry_round_trip(sys.argv[1]); print('ROUND TRIP')", there,
            )  # fmt: skip
            assert client.stdout.strip() == "ROUND TRIP", client.stderr[-3000:]
            registry_round_trip(here)  # and the host's clients on loopback, in the same run
        finally:
            tunnel.stop()
            server.stop()


@needs_kubectl
def test_read_only_says_at_start_that_it_does_not_guard_the_services(
    cluster: LocalCluster, apiserver: Path, tmp_path: Path
) -> None:
    """--read-only reads Kafka's requests, not a service's HTTP: `up` says so before the
    services' settings, once, and forwards them as ever."""
    shop_world(apiserver)
    server = pod(cluster, "schema-registry", 8081, "schema-registry-7c9d-a")
    tunnel = ManagedProcess(
        [sys.executable, "-m", "kafkatunnel", "up", "--via", "kubectl", "-n", "shop",
         "--listen", f"127.0.0.1:{free_port_run(8)}", "--no-table", "--read-only",
         "--service", "schema-registry"],
        name="kafkatunnel-up-companions-read-only",
        env={**os.environ, "KAFKATUNNEL_STATE_DIR": str(tmp_path / "state")},
    )  # fmt: skip
    try:
        registry = tunnel.wait_for_line(r"^schema\.registry\.url=(\S+)$", timeout=60)[1]
        said = tunnel.output()
        assert said.count(READ_ONLY_NOTE) == 1, said
        assert said.index(READ_ONLY_NOTE) < said.index("schema.registry.url="), said
        registry_round_trip(registry)  # a write (a schema registered): not guarded
    finally:
        tunnel.stop()
        server.stop()


def test_a_namespace_naming_too_many_companions_gets_a_bounded_number(world: Any) -> None:
    """A listing is the cluster's answer: a hundred services labelled as Schema Registries
    get 32 forwards (each costs listeners and a kubectl), the rest named in a note."""
    services = {f"registry-{i:03d}": {"selector": REGISTRY, "labels": REGISTRY,
                                      "ports": [{"port": 8081}]} for i in range(100)}  # fmt: skip
    world(namespaces={"shop": {"pods": [], "services": services}})
    found = ServiceForwarder(KubectlForwarder(Kubectl(namespace="shop")), [], discover=True)
    asyncio.run(found.prepare())
    assert [t.name for t in found.targets()] == [f"registry-{i:03d}" for i in range(32)]
    assert found.notes == [
        "100 companions found: forwarding the first 32 by name, not registry-032, "
        "registry-033, registry-034, registry-035, registry-036...; name others with "
        "--service NAME"
    ]
