"""Services beside the brokers, without a cluster: what `--service` accepts, what a
listing from the cluster may hold, which pod and container port kubectl would pick, which
companion each deployer's labels mean, and the names the shim serves for a service."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from kafkatunnel.dns.names import Zone
from kafkatunnel.hostnames import ClusterZones
from kafkatunnel.kube import companions
from kafkatunnel.kube.pods import Pod
from kafkatunnel.kube.services import (
    ServiceError,
    ServicePort,
    ServiceRequest,
    container_port,
    first_pod,
    parse_service,
    parse_services,
)
from kafkatunnel.waiting import async_wait_for

pytestmark = pytest.mark.quick


def item(name: str, namespace: str = "shop", **spec: Any) -> dict[str, Any]:
    labels = spec.pop("labels", {})
    spec = {"selector": {"app": name[:20]}, "ports": [{"port": 8081}], **spec}
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": spec}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("schema-registry", ServiceRequest("schema-registry")),
        ("schema-registry:8081", ServiceRequest("schema-registry", 8081)),
        ("schema-registry=18081", ServiceRequest("schema-registry", None, 18081)),
        ("keycloak:8080=18080", ServiceRequest("keycloak", 8080, 18080)),
    ],
)
def test_a_service_request_is_name_port_and_local_port(text: str, expected: ServiceRequest) -> None:
    assert ServiceRequest.parse(text) == expected
    assert str(ServiceRequest.parse(text)) == text


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "is not a Kubernetes service name"),
        ("Schema", "is not a Kubernetes service name"),
        ("9registry", "is not a Kubernetes service name"),
        ("a" * 64, "is not a Kubernetes service name"),
        ("registry:", "PORT '' is not a port"),
        ("registry:70000", "PORT '70000' is not a port"),
        ("registry:-1", "PORT '-1' is not a port"),
        ("registry=x", "LOCALPORT 'x' is not a port"),
        ("../../etc", "is not a Kubernetes service name"),
    ],
)
def test_a_bad_service_request_says_what_is_wrong(text: str, said: str) -> None:
    with pytest.raises(ServiceError, match=said.replace("(", r"\(")):
        ServiceRequest.parse(text)


def test_hostile_service_names_from_the_cluster_are_left_out() -> None:
    """A listing is the cluster's answer: names Kubernetes itself would refuse never become
    kubectl arguments or DNS names."""
    listing = {"items": [
        item("schema-registry"),
        item("evil name"), item("--kubeconfig=/tmp/x"), item("a\nb"), item("../etc"),
        item("UPPER"), item("x" * 64), item("fine", namespace="bad/namespace"),
        item("fine", namespace="a" * 64),
    ]}  # fmt: skip
    assert [s.name for s in parse_services(listing)] == ["schema-registry"]
    with pytest.raises(ServiceError):
        parse_service(item("evil name"))


def test_a_service_keeps_its_tcp_ports_and_named_targets() -> None:
    service = parse_service(item("registry", ports=[
        {"port": 8081, "targetPort": "http", "name": "http"},
        {"port": 9000, "targetPort": "9001"},
        {"port": 53, "protocol": "UDP"},
    ]))  # fmt: skip
    assert service.ports == (ServicePort(8081, "http", "http"), ServicePort(9000, 9001))
    assert service.port(None).port == 8081 and service.port(9000).target == 9001
    with pytest.raises(ServiceError, match=r"has no port 1 \(it has 8081, 9000\)"):
        service.port(1)


def pod(name: str, ready: bool = True, phase: str = "Running") -> Pod:
    return Pod(name, "10.0.0.1", (8081,), phase == "Running", phase, ready,
               named_ports=(("http", 8081),))  # fmt: skip


def test_the_pod_is_the_one_kubectl_would_pick() -> None:
    assert first_pod([]) is None
    pending, starting, ready = pod("a", False, "Pending"), pod("b", False), pod("c")
    assert first_pod([pending, starting, ready]) == ready
    assert first_pod([pending, starting]) == starting
    assert container_port(ServicePort(80, "http"), ready) == 8081
    assert container_port(ServicePort(80, 8080), ready) == 8080
    with pytest.raises(ServiceError, match="has no container port named 'admin'"):
        container_port(ServicePort(80, "admin"), ready)


@pytest.mark.parametrize(
    ("name", "labels", "kind"),
    [
        ("schemaregistry", {"platform.confluent.io/type": "schemaregistry"}, "schema-registry"),
        ("my-cp-schema-registry", {"app": "cp-schema-registry"}, "schema-registry"),
        ("registry", {"app.kubernetes.io/name": "schema-registry"}, "schema-registry"),
        ("apicurio-app-service", {"app.kubernetes.io/name": "apicurio-registry"},
         "apicurio-registry"),
        ("registry-service", {"apicur.io/type": "ApicurioRegistry"}, "apicurio-registry"),
        ("karapace", {"app": "karapace"}, "karapace"),
        ("shop-connect-api", {"strimzi.io/kind": "KafkaConnect"}, "connect"),
        ("connect", {"platform.confluent.io/type": "connect"}, "connect"),
        ("shop-bridge-service", {"strimzi.io/kind": "KafkaBridge"}, "kafka-bridge"),
        ("keycloak", {"app.kubernetes.io/name": "keycloak"}, "keycloak"),
        ("kc-service", {"app": "keycloak"}, "keycloak"),
        # not companions: Strimzi's other Connect and Bridge services, Kafka, anything else
        ("shop-connect", {"strimzi.io/kind": "KafkaConnect"}, None),
        ("shop-kafka-bootstrap", {"strimzi.io/kind": "Kafka"}, None),
        ("web", {"app": "web"}, None),
    ],
)  # fmt: skip
def test_companions_are_known_by_their_deployers_labels(
    name: str, labels: dict[str, str], kind: str | None
) -> None:
    service = parse_service(item(name, labels=labels))
    assert companions.kind_of(service) == kind
    assert companions.find([service]) == ([(service, kind)] if kind else [])


def test_a_companion_is_used_on_its_usual_port() -> None:
    keycloak = parse_service(item("keycloak", ports=[
        {"port": 8443, "name": "https"}, {"port": 8080, "name": "http"},
        {"port": 9000, "name": "management"},
    ]))  # fmt: skip
    assert companions.usual_port(keycloak, "keycloak").port == 8080
    bitnami = parse_service(item("keycloak", ports=[{"port": 80, "targetPort": 8080}]))
    assert companions.usual_port(bitnami, "keycloak").port == 80  # its container port is 8080
    other = parse_service(item("x", ports=[{"port": 1, "name": "grpc"},
                                           {"port": 2, "name": "http"}]))  # fmt: skip
    assert companions.usual_port(other, None).port == 2


def test_client_settings_name_the_url() -> None:
    url = "http://schema-registry.shop.svc.cluster.local:8081"
    assert companions.client_settings("schema-registry", url) == [f"schema.registry.url={url}"]
    assert companions.client_settings("apicurio-registry", "http://a:8080") == [
        "schema.registry.url=http://a:8080/apis/ccompat/v7"
    ]
    (token,) = companions.client_settings("keycloak", "http://kc:8080")
    assert token.startswith("sasl.oauthbearer.token.endpoint.url=http://kc:8080/realms/")


def test_a_services_names_stay_inside_the_cluster_zones() -> None:
    zones = ClusterZones.of([], namespaces=["staging"])
    zone = Zone()
    zone.add(zones.service_names("Schema-Registry", "staging"), "127.0.1.2")
    for form in ("schema-registry", "schema-registry.staging", "schema-registry.staging.svc",
                 "SCHEMA-REGISTRY.staging.svc.cluster.local."):  # fmt: skip
        assert zone.lookup(form) == "127.0.1.2", form
    assert zone.lookup("other.staging.svc.cluster.local") is None
    assert zone.exists("staging.svc.cluster.local")
    assert not zone.exists("other.staging.svc.cluster.local")
    # what the resolver is handed: names inside the zones or short forms of such names, and
    # domains inside the zones only (the short forms' own are not: /etc/hosts holds them)
    assert zones.refusal(zone.names, zone.domains) is None
    assert zones.refusal(zone.names, zone.apexes) is None
    assert zone.apexes == {"svc", "cluster.local"}
    # a namespace that is a public suffix (`.shop`) gives no `NAME.NS` form, nor `shop` as
    # a domain; a service named like a TLD gives no `NAME`
    zones = ClusterZones.of([], namespaces=["shop"])
    zone = Zone()
    zone.add(zones.service_names("schema-registry", "shop"), "127.0.1.2")
    zone.add(zones.service_names("com", "shop"), "127.0.1.3")
    assert set(zone.names) == {
        "schema-registry", "schema-registry.shop.svc", "schema-registry.shop.svc.cluster.local",
        "com.shop.svc", "com.shop.svc.cluster.local",
    }  # fmt: skip
    assert zone.apexes == {"svc", "cluster.local"}


@pytest.mark.parametrize("pending", [True, False])
def test_a_pod_on_its_way_is_looked_for_again_soon_not_later(pending: bool) -> None:
    """While a service's (or broker's) pod is starting, the forward's supervisor asks again
    every `low` seconds, so a pod that turns ready after a long start is used at once; other
    failures back off exponentially. The delay chosen shows in the forward's state."""
    from kafkatunnel.kube.kubectl import Kubectl, KubectlError
    from kafkatunnel.kube.portforward import PortForward

    delays: list[float] = []
    low = 0.2

    async def resolve() -> str:
        if forward.state.startswith("restarting in "):
            delays.append(float(forward.state.removeprefix("restarting in ").rstrip("s")))
        raise KubectlError("pod schema-registry-b is Running but not Ready", pending=pending)

    async def tried() -> bool:
        return len(delays) >= 4

    async def supervise() -> None:
        forward.start()
        try:
            await async_wait_for(tried, timeout=30, what="four tries")
        finally:
            await forward.stop()

    forward = PortForward(Kubectl(), resolve, 8081, lambda: None, backoff=(low, 30.0))
    asyncio.run(supervise())
    if pending:
        assert max(delays) <= low, delays
    else:
        assert delays[3] >= 4 * low * 0.5, delays  # the control: 0.2, 0.4, 0.8, 1.6 (jittered)


def test_the_probes_tell_a_live_service_from_a_dead_or_silent_one() -> None:
    """probe_tcp (a service of unknown protocol: the far end must keep the connection) and
    probe_http (any answer will do), each against real listeners on loopback."""
    from kafkatunnel.kube.portforward import probe_http, probe_tcp

    async def scenario() -> dict[str, str | None]:
        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()  # keeps it open, says nothing
            writer.close()

        async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.0 404 Not Found\r\n\r\n")
            writer.close()

        servers = {name: await asyncio.start_server(handler, "127.0.0.1", 0)
                   for name, handler in (("hold", hold), ("hang_up", hang_up),
                                         ("answer", answer))}  # fmt: skip
        port = {name: s.sockets[0].getsockname()[1] for name, s in servers.items()}
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        nobody = closed.getsockname()[1]
        closed.close()
        said = {
            "tcp kept": await probe_tcp(port["hold"], 2.0),
            "tcp hung up": await probe_tcp(port["hang_up"], 2.0),
            "tcp nobody": await probe_tcp(nobody, 2.0),
            "http answered": await probe_http(port["answer"], 2.0),
            "http silent": await probe_http(port["hold"], 0.3),
        }
        for server in servers.values():
            server.close()
        return said

    said = asyncio.run(scenario())
    assert said["tcp kept"] is None and said["http answered"] is None, said
    assert said["tcp hung up"] == "closed", said
    assert str(said["tcp nobody"]).startswith("cannot connect to the forward"), said
    assert said["http silent"] == "no answer to an HTTP request within 0.3s", said
