"""The services beside the brokers (a Schema Registry, Connect's REST API, a token issuer):
each on a port of the listen address and, with the DNS shim, on its own loopback address
and its original port, where its in-cluster names lead. Bytes pass untouched.

How a service is found and reached is the forwarder's (`CompanionForwarder`): this layer
only listens, names and counts.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import socket
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafkatunnel.dns.names import Zone
from kafkatunnel.hostnames import ClusterZones, join_address
from kafkatunnel.tunnel.forwarders import Forwarder
from kafkatunnel.tunnel.listeners import Acceptor, PortInUse, bind_listener
from kafkatunnel.tunnel.registry import Endpoint

log = logging.getLogger("kafkatunnel.companions")
PORT_ATTEMPTS = 100  # ports tried past a service's own when it is taken
UNPRIVILEGED = 1024  # ports below this need root to bind (Linux's ip_unprivileged_port_start)
LIFT = 8000  # where a privileged port's local stand-in starts: 80 -> 8080


@dataclass(frozen=True)
class Target:
    """A service to serve: its name and namespace (checked by whoever found it), the service
    port clients use, the local port asked for (None: that port when free) and what kind of
    companion it is (None: a service the user named)."""

    name: str
    namespace: str
    port: int
    local_port: int | None = None
    kind: str | None = None


class CompanionForwarder(Forwarder):
    """A forwarder that also says which services it reaches: open(NAME, PORT)."""

    notes: list[str]

    @abstractmethod
    def targets(self) -> list[Target]:
        """The services found by prepare()."""


@dataclass
class Companion:
    target: Target
    endpoint: Endpoint  # the loopback listener; its counters count both listeners
    names: list[str] = field(default_factory=list)  # in-cluster names the shim resolves
    dns_address: str | None = None

    def url(self, with_names: bool, told: str | None = None) -> str:
        """http://HOST:PORT a client uses: the in-cluster name and port when the shim
        resolves it, else the host it is told (--advertise, a container's) on the port of
        the listener, else the listener itself."""
        if with_names and self.names:
            return f"http://{self.names[-1]}:{self.target.port}"
        address = join_address(told or self.endpoint.listen_host, self.endpoint.listen_port)
        return f"http://{address}"

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.endpoint.as_dict(),
            "name": self.target.name,
            "namespace": self.target.namespace,
            "kind": self.target.kind,
            "port": self.target.port,
            "names": self.names,
            "dns_address": self.dns_address,
        }


class Companions:
    """Listeners for the services a CompanionForwarder found."""

    def __init__(self, forwarder: CompanionForwarder, listen_host: str = "127.0.0.1") -> None:
        self.forwarder = forwarder
        self.listen_host = listen_host
        self.served: list[Companion] = []
        self.acceptors: list[Acceptor] = []
        self.notes: list[str] = []

    async def start(
        self,
        accept: Callable[[Endpoint, socket.socket], None],
        zone: Zone | None = None,
        first_address: str | None = None,
        zones: ClusterZones | None = None,
        also_on: tuple[str, ...] = (),
    ) -> None:
        """Find the services and listen for each, on the listen address and on `also_on`'s
        (a Docker bridge's) on one port; with a zone, also on its own loopback address (from
        `first_address` on) and original port, its names (those `zones` allow) added.
        A local port asked for and taken is an error (PortInUse); any other is moved on."""
        await self.forwarder.prepare()
        self.notes.extend(self.forwarder.notes)
        address = ipaddress.IPv4Address(first_address) if first_address else None
        for target in self.forwarder.targets():
            sockets, port = self._bind_local(target, (self.listen_host, *also_on))
            endpoint = Endpoint(None, target.name, target.port, self.listen_host, port)
            endpoint.route = self.forwarder.describe(target.name, target.port)
            companion = Companion(target, endpoint)
            if zone is not None and address is not None and zones is not None:
                named = self._bind_name(companion, str(address))
                address += 1
                if named is not None:
                    sockets.append(named)
                    names = zones.service_names(target.name, target.namespace)
                    zone.add(names, str(companion.dns_address))
                    companion.names = sorted(names.forms, key=len)
            for each in sockets:
                acceptor = Acceptor(each, functools.partial(accept, endpoint))
                acceptor.start()
                self.acceptors.append(acceptor)
            endpoint.state = "listening"
            self.served.append(companion)
            self.forwarder.expect(target.name, target.port)
            log.info("service %s.%s:%d -> %s", target.name, target.namespace, target.port,
                     endpoint.local)  # fmt: skip

    def _bind_local(
        self, target: Target, hosts: tuple[str, ...]
    ) -> tuple[list[socket.socket], int]:
        """One port on every host: LOCALPORT, or the service's own (a privileged one
        lifted) or the next free on all of them."""
        flag = f"--service {target.name}:{target.port}=LOCALPORT"
        first = target.port if target.port >= UNPRIVILEGED else LIFT + target.port
        ports = (
            [target.local_port]
            if target.local_port is not None
            else range(first, min(first + PORT_ATTEMPTS, 65536))
        )
        last: PortInUse | None = None
        for port in ports:
            bound: list[socket.socket] = []
            try:
                for host in hosts:
                    bound.append(bind_listener(host, port, flag))
                return bound, port
            except PortInUse as error:
                for sock in bound:
                    sock.close()
                if target.local_port is not None:
                    raise
                last = error
        raise PortInUse(f"service {target.name}: no free port from {first} on ({last})")

    def _bind_name(self, companion: Companion, address: str) -> socket.socket | None:
        """Its own loopback address on the service's port; None (with a note) if not."""
        target = companion.target
        try:
            sock = bind_listener(address, target.port, "--dns-first-address")
        except PortInUse as error:
            companion.endpoint.note = f"not resolved: {error}"
            log.warning("service %s: %s", target.name, companion.endpoint.note)
            return None
        companion.dns_address = address
        return sock

    def status(self) -> list[dict[str, Any]]:
        for companion in self.served:
            target = companion.target
            companion.endpoint.route = self.forwarder.describe(target.name, target.port)
        return [c.as_dict() for c in self.served]

    def close(self) -> None:
        for acceptor in self.acceptors:
            acceptor.close()
