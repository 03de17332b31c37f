"""Which pod a broker lives in: by the first label of its advertised name (`kafka-0` of
`kafka-0.kafka-headless...`), or by pod IP (and container port) for brokers that advertise
IP addresses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Pod labels of the common Kafka distributions, tried in order when no target is given.
DEFAULT_SELECTORS = (
    "app.kubernetes.io/name=kafka",  # Bitnami chart, and most charts
    "strimzi.io/kind=Kafka",  # Strimzi (broker and controller pods)
    "app=kafka",
)


@dataclass(frozen=True)
class Pod:
    name: str
    ip: str | None
    ports: tuple[int, ...]
    running: bool
    phase: str = "Running"
    ready: bool = True  # its Ready condition: the broker passes its readiness probe

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
        ports = tuple(
            int(port["containerPort"])
            for container in item.get("spec", {}).get("containers", [])
            for port in container.get("ports", []) or []
            if "containerPort" in port
        )
        status = item.get("status", {})
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        phase = status.get("phase") or "Unknown"
        pods.append(
            Pod(
                name=item["metadata"]["name"],
                ip=status.get("podIP"),
                ports=ports,
                running=phase == "Running",
                phase=phase,
                ready=conditions.get("Ready", "True") == "True",
            )
        )
    return sorted(pods, key=lambda p: p.name)


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
