"""Supervised port-forwards to the services beside the brokers (`--service`, `--companions`):
the brokers' forwards, re-aimed at a service's pods.

Each forward goes to the pod kubectl would pick for `kubectl port-forward svc/NAME`, and is
re-picked from the service's selector whenever it goes (a Deployment's new pod has a new
name). Restarts, zombie detection and sleep checks are the brokers'; the probe is an HTTP
request for services that speak HTTP (every known companion does) and a kept TCP connection
for the others.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafkatunnel.kube import companions
from kafkatunnel.kube.forwarder import KubectlForwarder
from kafkatunnel.kube.kubectl import KubectlError
from kafkatunnel.kube.pods import Pod, parse_pods
from kafkatunnel.kube.portforward import Probe, probe_http, probe_tcp
from kafkatunnel.kube.services import (
    Service,
    ServiceError,
    ServicePort,
    ServiceRequest,
    container_port,
    first_pod,
    parse_service,
    parse_services,
)
from kafkatunnel.tunnel.companions import CompanionForwarder, Target

# Each companion costs a listener (two with --dns), a loopback address and a kubectl
# process; a namespace whose listing names more is more likely broken than that busy.
MAX_DISCOVERED = 32


@dataclass(frozen=True)
class Chosen:
    """A service to forward: which of its ports, the local port asked for (None: its own
    port when free), and what kind of companion it is (None: just a service)."""

    service: Service
    port: ServicePort
    local_port: int | None
    kind: str | None
    named: bool = False  # by the user (--service): a problem with it stops `up`

    @property
    def key(self) -> str:
        return self.service.name


class ServiceForwarder(KubectlForwarder, CompanionForwarder):
    """Forwards by service name: open(NAME, PORT) reaches service NAME's port PORT."""

    follows_pods = False  # a service's pods are found anew on each try (_resolve)

    def __init__(
        self,
        brokers: KubectlForwarder,
        requests: list[ServiceRequest],
        discover: bool = False,
    ) -> None:
        super().__init__(brokers.kubectl, backoff=brokers.backoff, keepalive=brokers.keepalive,
                         ready_timeout=brokers.ready_timeout)  # fmt: skip
        self.brokers = brokers
        self.requests = requests
        self.discover = discover
        self.chosen: list[Chosen] = []
        self.notes: list[str] = []  # what discovery could not use, said once
        self._ports: dict[str, int] = {}  # container port per service

    async def prepare(self) -> None:
        """Find the services: those asked for by name (a missing one is an error) and, with
        discovery, every companion in the brokers' namespace. The namespace is the brokers':
        known only once their forwarder has prepared."""
        self.kubectl = self.brokers.kubectl
        chosen: dict[str, Chosen] = {}
        if self.discover:
            listing = await self.kubectl.get_json("services")
            found = companions.find(parse_services(listing))
            if len(found) > MAX_DISCOVERED:
                skipped = ", ".join(s.name for s, _ in found[MAX_DISCOVERED : MAX_DISCOVERED + 5])
                self.notes.append(
                    f"{len(found)} companions found: forwarding the first {MAX_DISCOVERED} by "
                    f"name, not {skipped}...; name others with --service NAME"
                )
                found = found[:MAX_DISCOVERED]
            for service, kind in found:
                try:
                    port = companions.usual_port(service, kind)
                except ServiceError as cause:
                    self.notes.append(f"{kind} {service.name}: {cause}")
                    continue
                chosen[service.name] = Chosen(service, port, None, kind)
            if not chosen:
                where = self.kubectl.namespace or "the current namespace"
                self.notes.append(
                    f"no companions found in {where} (Schema Registry, Apicurio, Karapace, "
                    "Connect, Kafka Bridge, Keycloak): name one with --service NAME"
                )
        for request in self.requests:
            try:
                service = parse_service(await self.kubectl.get_json(f"service/{request.name}"))
            except KubectlError as cause:
                if "not found" not in str(cause):
                    raise KubectlError(f"--service {request}: {cause}",
                                       permanent=cause.permanent) from None  # fmt: skip
                where = self.kubectl.namespace or "the current namespace"
                raise KubectlError(
                    f'--service {request}: no service "{request.name}" in {where} '
                    "(`kubectl get services` lists them; the namespace is the brokers')",
                    permanent=True,
                ) from None
            except ServiceError as cause:
                raise KubectlError(f"--service {request}: {cause}", permanent=True) from None
            known = companions.kind_of(service)
            try:
                port = (service.port(request.port) if request.port
                        else companions.usual_port(service, known))  # fmt: skip
            except ServiceError as cause:
                raise KubectlError(f"--service {request}: {cause}", permanent=True) from None
            chosen[service.name] = Chosen(service, port, request.local_port, known, named=True)
        self.chosen, self._ports = [], {}
        for each in sorted(chosen.values(), key=lambda c: c.key):
            try:
                self._ports[each.key] = await self._container_port(each)
            except KubectlError as cause:
                if each.named:
                    raise
                self.notes.append(f"{each.kind} {each.key} is not forwarded: {cause}")
                continue
            self.chosen.append(each)

    async def _container_port(self, chosen: Chosen) -> int:
        """The container port behind the chosen service port: a targetPort's number, or
        the port its name has in the pod kubectl picks now (a Deployment's pods share it)."""
        if not chosen.service.selector:
            raise KubectlError(
                f"service {chosen.key} has no selector (its endpoints are set by hand): "
                "kubectl cannot forward to it; name a service that selects pods",
                permanent=True,
            )
        if isinstance(chosen.port.target, int):
            return chosen.port.target
        pod = first_pod(await self._pods_of(chosen.service))
        if pod is None:
            raise KubectlError(f"service {chosen.key} selects no pods "
                               f"({chosen.service.selector_text}): is it deployed?")  # fmt: skip
        try:
            return container_port(chosen.port, pod)
        except ServiceError as cause:
            raise KubectlError(str(cause), permanent=True) from None

    def targets(self) -> list[Target]:
        return [
            Target(c.key, c.service.namespace, c.port.port, c.local_port, c.kind)
            for c in self.chosen
        ]

    def find(self, name: str) -> Chosen:
        found = next((c for c in self.chosen if c.service.name == name), None)
        if found is None:
            raise KubectlError(f"no service {name} is forwarded")
        return found

    async def _pods_of(self, service: Service) -> list[Pod]:
        return parse_pods(await self.kubectl.get_json("pods", "-l", service.selector_text))

    async def _resolve(self, host: str, port: int) -> str:
        """The pod kubectl would pick for the service now; KubectlError when none can
        serve, saying which and why."""
        service = self.find(host).service
        pods = await self._pods_of(service)
        pod = first_pod(pods)
        if pod is None:
            raise KubectlError(
                f"service {service.name} selects no pods ({service.selector_text}): is it "
                f"deployed? (`kubectl get pods -l {service.selector_text}`)",
                pending=True,  # between a Deployment's old pod and its new one
            )
        problem = pod.why_unusable()
        if problem is not None:
            raise KubectlError(f"{problem}: service {service.name} is unreachable until it "
                               f"is (`kubectl describe pod {pod.name}`)",
                               pending=True)  # fmt: skip
        chosen = self.find(host)
        try:
            target = container_port(chosen.port, pod)
        except ServiceError as cause:
            raise KubectlError(str(cause), permanent=True) from None
        if target != self._ports[host]:
            raise KubectlError(
                f"pod {pod.name} serves port {chosen.port.port} on container port {target}, "
                f"not {self._ports[host]}: restart the tunnel"
            )
        return pod.name

    def _key(self, host: str, port: int) -> tuple[str, int]:
        return f"svc/{host}", port

    def _pod_port(self, host: str, port: int) -> int:
        return self._ports[host]

    def _probe_for(self, host: str, port: int) -> Probe | None:
        chosen = self.find(host)
        return probe_http if chosen.kind or chosen.port.speaks_http() else probe_tcp

    def describe(self, host: str, port: int) -> str:
        forward = self.forwards.get(self._key(host, port))
        return forward.describe() if forward else f"kubectl (svc/{host})"
