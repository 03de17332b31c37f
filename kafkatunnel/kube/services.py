"""Kubernetes services beside the brokers (a Schema Registry, Connect's REST API): what the
user asks for (`--service NAME[:PORT][=LOCALPORT]`), what the cluster says a service is,
and the pod and container port a forward to it reaches, chosen as kubectl chooses them.

`kubectl port-forward svc/NAME PORT` (kubectl 1.20-1.33) takes the first pod of the
service's selector, most active first (`GetFirstPod` sorted by
`sort.Reverse(podutils.ActivePods)`: ready before not ready, running before pending), and
turns the service port into the container port its `targetPort` names
(`LookupContainerPortNumberByServicePort`): a number, or a container port's name. kubectl
does this once; the tunnel does it again whenever the pod goes.

A service's name and namespace come from the cluster and become kubectl arguments and DNS
names: both are checked as Kubernetes checks them (RFC 1035 and RFC 1123 labels).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kafkatunnel.kube.pods import Pod

# A Service's name is an RFC 1035 label, a namespace's an RFC 1123 label (Kubernetes'
# validation.IsDNS1035Label / IsDNS1123Label).
SERVICE_NAME = re.compile(r"[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")
NAMESPACE_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")


class ServiceError(ValueError):
    """A service the tunnel cannot use; the message says why and what to do."""


def check_service_name(name: str, what: str = "service name") -> str:
    if not SERVICE_NAME.match(name):
        shown = repr(name[:70])
        raise ServiceError(
            f"{shown} is not a Kubernetes {what} (lower-case letters, digits and '-', "
            "starting with a letter, at most 63)"
        )
    return name


def check_namespace(name: str) -> str:
    if not NAMESPACE_NAME.match(name):
        raise ServiceError(f"{name[:70]!r} is not a Kubernetes namespace name")
    return name


@dataclass(frozen=True)
class ServiceRequest:
    """`--service NAME[:PORT][=LOCALPORT]`: which service, which of its ports (None: its
    only one, or the first), and the local port on loopback (None: the service's own port
    when free, else the next free one)."""

    name: str
    port: int | None = None
    local_port: int | None = None

    @classmethod
    def parse(cls, text: str) -> ServiceRequest:
        spec, sep, local = text.partition("=")
        name, colon, port = spec.partition(":")
        check_service_name(name)
        numbers: list[int | None] = []
        for value, given, what in ((port, colon, "PORT"), (local, sep, "LOCALPORT")):
            if not given:
                numbers.append(None)
            elif value.isascii() and value.isdigit() and 0 < int(value) < 65536:
                numbers.append(int(value))
            else:
                raise ServiceError(
                    f"{text!r}: {what} {value!r} is not a port (1-65535); expected "
                    "NAME[:PORT][=LOCALPORT], e.g. schema-registry:8081=18081"
                )
        return cls(name, numbers[0], numbers[1])

    def __str__(self) -> str:
        port = f":{self.port}" if self.port else ""
        local = f"={self.local_port}" if self.local_port else ""
        return f"{self.name}{port}{local}"


@dataclass(frozen=True)
class ServicePort:
    port: int
    target: int | str  # the container port: a number, or the name of one
    name: str = ""
    app_protocol: str = ""  # spec.ports[].appProtocol, when the chart says

    def speaks_http(self) -> bool:
        said = f"{self.name} {self.app_protocol}".lower()
        return "http" in said or "rest" in said


@dataclass(frozen=True)
class Service:
    name: str
    namespace: str
    selector: tuple[tuple[str, str], ...]
    ports: tuple[ServicePort, ...]
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def selector_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.selector)

    def port(self, wanted: int | None) -> ServicePort:
        """The service port asked for, or its first; ServiceError naming those it has."""
        if not self.ports:
            raise ServiceError(f"service {self.name} has no ports")
        if wanted is None:
            return self.ports[0]
        for port in self.ports:
            if port.port == wanted:
                return port
        have = ", ".join(str(p.port) for p in self.ports)
        raise ServiceError(f"service {self.name} has no port {wanted} (it has {have})")


def parse_service(item: dict[str, Any]) -> Service:
    """A Service object as `kubectl get svc -o json` gives it; ServiceError for one whose
    name or namespace Kubernetes itself would not allow."""
    metadata = item.get("metadata") or {}
    spec = item.get("spec") or {}
    name = check_service_name(str(metadata.get("name", "")))
    namespace = check_namespace(str(metadata.get("namespace") or "default"))
    ports = []
    for entry in spec.get("ports") or []:
        if str(entry.get("protocol", "TCP")).upper() != "TCP" or "port" not in entry:
            continue  # kubectl port-forward carries TCP only
        target = entry.get("targetPort", entry["port"])
        if isinstance(target, str) and target.isdigit():
            target = int(target)
        ports.append(ServicePort(int(entry["port"]), target, str(entry.get("name") or ""),
                                 str(entry.get("appProtocol") or "")))  # fmt: skip
    selector = tuple(sorted((str(k), str(v)) for k, v in (spec.get("selector") or {}).items()))
    labels = tuple(sorted((str(k), str(v)) for k, v in (metadata.get("labels") or {}).items()))
    return Service(name, namespace, selector, tuple(ports), labels)


def parse_services(listing: dict[str, Any]) -> list[Service]:
    """The usable services of a listing; those with names Kubernetes would refuse are left
    out (a listing is the cluster's answer, not the user's)."""
    found = []
    for item in listing.get("items", []):
        try:
            found.append(parse_service(item))
        except ServiceError:
            continue
    return sorted(found, key=lambda s: s.name)


def first_pod(pods: list[Pod]) -> Pod | None:
    """The pod kubectl's port-forward would pick: ready and running first, then by name
    (kubectl then prefers the longest ready; the name keeps the choice stable here)."""
    ranked = sorted(pods, key=lambda p: (not p.ready, not p.running, p.name))
    return ranked[0] if ranked else None


def container_port(port: ServicePort, pod: Pod) -> int:
    """The pod's port behind a service port: its number, or the container port so named."""
    if isinstance(port.target, int):
        return port.target
    found = pod.port_named(port.target)
    if found is None:
        raise ServiceError(
            f"pod {pod.name} has no container port named {port.target!r} (the service's "
            f"targetPort for port {port.port})"
        )
    return found
