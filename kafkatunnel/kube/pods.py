"""Which pods are Kafka brokers, and which pod a broker lives in: by the first label of its
advertised name (`kafka-0` of `kafka-0.kafka-headless...`), or by pod IP (and container
port) for brokers that advertise IP addresses.

The common distributions label their pods differently, and run pods that are not brokers
under the same labels: Strimzi's ZooKeeper, entity operator and, with KRaft node pools,
controller-only pods (`strimzi.io/broker-role=false`); Bitnami's controller-only
`kafka-controller-N` (`KAFKA_CFG_PROCESS_ROLES=controller`); Confluent for Kubernetes'
KRaft controllers (`platform.confluent.io/type=kraftcontroller`). Those are never brokers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Pod labels of the common Kafka distributions, tried in order when no target is given.
DEFAULT_SELECTORS = (
    "app.kubernetes.io/name=kafka",  # Bitnami chart, Strimzi's Kafka pods, most charts
    "strimzi.io/kind=Kafka",  # Strimzi (all of a Kafka resource's pods)
    "platform.confluent.io/type=kafka",  # Confluent for Kubernetes
    "app=kafka",
)
ROLE_VARIABLES = ("KAFKA_CFG_PROCESS_ROLES", "KAFKA_PROCESS_ROLES")  # Bitnami, Apache images


@dataclass(frozen=True)
class Pod:
    name: str
    ip: str | None
    ports: tuple[int, ...]
    running: bool
    phase: str = "Running"
    ready: bool = True  # its Ready condition: the broker passes its readiness probe
    namespace: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    roles: str | None = None  # process.roles from its environment, when it says
    named_ports: tuple[tuple[str, int], ...] = ()  # container ports that have a name
    secrets: tuple[str, ...] = ()  # the secrets its volumes mount (as the cluster says)
    uid: str | None = None  # a pod made again under its name (a StatefulSet's) has a new one
    restarts: int = 0  # its containers' restarts: each is a broker starting again

    def port_named(self, name: str) -> int | None:
        return dict(self.named_ports).get(name)

    def is_broker(self) -> bool:
        """Not a ZooKeeper, operator or controller-only pod that shares the labels."""
        labels = dict(self.labels)
        role = labels.get("strimzi.io/broker-role")
        if role is not None:  # Strimzi with KRaft node pools
            return role == "true"
        if "strimzi.io/kind" in labels:  # Strimzi with ZooKeeper: <cluster>-kafka-N only
            return labels.get("strimzi.io/name", "").endswith("-kafka")
        if labels.get("platform.confluent.io/type") == "kraftcontroller":
            return False
        return self.roles is None or "broker" in self.roles.split(",")

    def why_unusable(self) -> str | None:
        """None for a pod a forward can reach; else what is wrong, as kubectl shows it."""
        if not self.running:
            return f"pod {self.name} is {self.phase}, not Running"
        if not self.ready:
            return f"pod {self.name} is Running but not Ready (its broker is starting or failing)"
        return None


def parse_pods(listing: dict[str, Any]) -> list[Pod]:
    pods = []
    for item in listing.get("items", []):
        declared = [
            port
            for container in item.get("spec", {}).get("containers", [])
            for port in container.get("ports", []) or []
            if "containerPort" in port
        ]
        ports = tuple(int(port["containerPort"]) for port in declared)
        named = tuple((str(p["name"]), int(p["containerPort"])) for p in declared if p.get("name"))
        env = {
            e.get("name"): e.get("value")
            for container in item.get("spec", {}).get("containers", [])
            for e in container.get("env", []) or []
        }
        roles = next((env[v] for v in ROLE_VARIABLES if env.get(v)), None)
        volumes = item.get("spec", {}).get("volumes") or []
        secrets = [v["secret"].get("secretName") for v in volumes if v.get("secret")] + [
            source["secret"].get("name")
            for v in volumes
            for source in (v.get("projected") or {}).get("sources") or []
            if source.get("secret")
        ]
        metadata = item["metadata"]
        status = item.get("status", {})
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        phase = status.get("phase") or "Unknown"
        pods.append(
            Pod(
                name=metadata["name"],
                ip=status.get("podIP"),
                ports=ports,
                running=phase == "Running",
                phase=phase,
                ready=conditions.get("Ready", "True") == "True",
                namespace=metadata.get("namespace"),
                labels=tuple(sorted((metadata.get("labels") or {}).items())),
                roles=roles,
                named_ports=named,
                secrets=tuple(str(s) for s in secrets if s),
                uid=metadata.get("uid"),
                restarts=_restarts(status),
            )
        )
    return sorted(pods, key=lambda p: p.name)


def _restarts(status: dict[str, Any]) -> int:
    return sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or [])


def pod_for(host: str, port: int, pods: list[Pod]) -> Pod | None:
    first = host.split(".", 1)[0]
    by_name = [p for p in pods if p.name == first]
    if by_name:
        return by_name[0]
    by_ip = [p for p in pods if p.ip == host]
    if len(by_ip) > 1:  # several pods share the IP (host networking): the port decides
        by_ip = [p for p in by_ip if port in p.ports]
    return by_ip[0] if len(by_ip) == 1 else None


def selector_of(resource: dict[str, Any]) -> str:
    """A label selector from a StatefulSet/Deployment (spec.selector.matchLabels) or a
    Service (spec.selector)."""
    spec = resource.get("spec", {})
    labels = spec.get("selector", {})
    if isinstance(labels, dict) and "matchLabels" in labels:
        labels = labels["matchLabels"]
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
