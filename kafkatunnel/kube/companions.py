"""The services a Kafka developer needs beside the brokers, found by the conventions of the
charts and operators that deploy them, and the client settings that use them.

Each convention is a set of labels (any one suffices) or a name suffix, as its deployer
writes them:

- Confluent Schema Registry: Confluent for Kubernetes labels its services
  `platform.confluent.io/type=schemaregistry`; the cp-helm-charts `app=cp-schema-registry`;
  Bitnami's chart `app.kubernetes.io/name=schema-registry`. Port 8081.
- Apicurio Registry: its operator's `app.kubernetes.io/name=apicurio-registry` (3.x) or
  `apicur.io/type=ApicurioRegistry` (2.x). Port 8080.
- Karapace (Aiven's registry): `app.kubernetes.io/name=karapace` or `app=karapace`. Port 8081.
- Kafka Connect's REST API: Strimzi's `<name>-connect-api` (`strimzi.io/kind=KafkaConnect`,
  port 8083 `rest-api`), CFK's `platform.confluent.io/type=connect`, `app=cp-kafka-connect`.
- Strimzi's Kafka Bridge: `<name>-bridge-service` (`strimzi.io/kind=KafkaBridge`, 8080).
- Keycloak, the usual OAUTHBEARER token issuer: `app.kubernetes.io/name=keycloak` (Bitnami's
  chart) or `app=keycloak` (the Keycloak operator).
"""

from __future__ import annotations

from dataclasses import dataclass

from kafkatunnel.kube.services import Service, ServicePort


@dataclass(frozen=True)
class Convention:
    kind: str  # what it is, as status shows it
    labels: tuple[tuple[str, str], ...]  # any one of these marks it
    name_suffixes: tuple[str, ...] = ()  # or a service name ending so
    port: int | None = None  # its usual port, preferred when the service has several

    def matches(self, service: Service) -> bool:
        labels = dict(service.labels)
        if any(labels.get(key) == value for key, value in self.labels):
            return True
        return service.name.endswith(self.name_suffixes) if self.name_suffixes else False


CONVENTIONS = (
    Convention("schema-registry", (("platform.confluent.io/type", "schemaregistry"),
                                   ("app", "cp-schema-registry"),
                                   ("app.kubernetes.io/name", "schema-registry")), port=8081),
    Convention("apicurio-registry", (("app.kubernetes.io/name", "apicurio-registry"),
                                     ("apicur.io/type", "ApicurioRegistry")), port=8080),
    Convention("karapace", (("app.kubernetes.io/name", "karapace"), ("app", "karapace")),
               port=8081),
    Convention("connect", (("platform.confluent.io/type", "connect"),
                           ("app", "cp-kafka-connect")), ("-connect-api",), port=8083),
    Convention("kafka-bridge", (), ("-bridge-service",), port=8080),
    Convention("keycloak", (("app.kubernetes.io/name", "keycloak"), ("app", "keycloak")),
               port=8080),
)  # fmt: skip
REGISTRIES = ("schema-registry", "apicurio-registry", "karapace")


def kind_of(service: Service) -> str | None:
    """Which companion `service` is by its deployer's conventions (None: none of them).
    Strimzi's headless `*-connect` services and Kafka's own are never companions."""
    labels = dict(service.labels)
    strimzi = labels.get("strimzi.io/kind")
    if strimzi == "KafkaConnect" and not service.name.endswith("-connect-api"):
        return None
    if strimzi == "KafkaBridge" and not service.name.endswith("-bridge-service"):
        return None
    return next((c.kind for c in CONVENTIONS if c.matches(service)), None)


def find(services: list[Service]) -> list[tuple[Service, str]]:
    """Every companion among a namespace's services, with its kind, by name."""
    found = [(service, kind_of(service)) for service in services]
    return [(service, kind) for service, kind in found if kind is not None]


def usual_port(service: Service, kind: str | None) -> ServicePort:
    """The port a companion is used on: its convention's, else the service's first (an
    HTTP one before others)."""
    usual = next((c.port for c in CONVENTIONS if c.kind == kind), None)
    for port in service.ports:
        if port.port == usual or (isinstance(port.target, int) and port.target == usual):
            return port
    http = [p for p in service.ports if p.speaks_http()]
    return (http or list(service.ports) or [service.port(None)])[0]


def client_settings(kind: str | None, url: str) -> list[str]:
    """What a client sets to use a companion at `url` (http://HOST:PORT)."""
    if kind in REGISTRIES:
        path = "/apis/ccompat/v7" if kind == "apicurio-registry" else ""
        return [f"schema.registry.url={url}{path}"]
    if kind == "connect":
        return [f"connect: {url} (GET {url}/connectors)"]
    if kind == "kafka-bridge":
        return [f"kafka bridge: {url}"]
    if kind == "keycloak":
        return [
            "sasl.oauthbearer.token.endpoint.url="
            f"{url}/realms/REALM/protocol/openid-connect/token (REALM: your realm)"
        ]
    return [f"service: {url}"]
