"""Which local address stands for which broker, and how each is doing.

Ports are stable per node id for the whole run: by default the bootstrap port + 1 + the
broker's index in node-id order (the first brokers seen are indexed together, in node-id
order; later ones take the next indexes), or what `--broker-port NODE=PORT` says.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kafkatunnel.protocol.headers import RequestHeader
from kafkatunnel.protocol.rewrite import BrokerAddress, UnknownBroker


@dataclass
class Tally:
    """What connections did beyond bytes and requests: answers rewritten, bytes spliced,
    coordinator answers' error codes. Summed over connections, open and closed."""

    rewrites: int = 0
    spliced: int = 0  # bytes moved without entering Python (splice)
    errors: dict[int, int] = field(default_factory=dict)

    def add(self, other: Tally) -> None:
        self.rewrites += other.rewrites
        self.spliced += other.spliced
        for code, count in other.errors.items():
            self.errors[code] = self.errors.get(code, 0) + count

    def copy(self) -> Tally:
        return Tally(self.rewrites, self.spliced, dict(self.errors))


@dataclass
class Endpoint:
    """A local listener and the broker it reaches. node_id None: the bootstrap listener."""

    node_id: int | None
    advertised_host: str
    advertised_port: int
    listen_host: str
    listen_port: int
    route: str = ""
    state: str = "starting"
    connections: int = 0
    total_connections: int = 0
    bytes_in: int = 0  # client -> broker
    bytes_out: int = 0  # broker -> client
    requests: int = 0
    errors: int = 0
    dns_address: str | None = None  # its own loopback address, for the DNS shim
    last_error: str | None = None
    last_error_at: float | None = None
    extra: dict[str, str] = field(default_factory=dict)
    api_requests: dict[int, int] = field(default_factory=dict)  # per API key
    closed: Tally = field(default_factory=Tally)  # of its closed connections

    @property
    def advertised(self) -> str:
        return f"{self.advertised_host}:{self.advertised_port}"

    @property
    def local(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    def count_request(self, header: RequestHeader | None = None) -> None:
        self.requests += 1
        if header is not None:
            self.api_requests[header.api_key] = self.api_requests.get(header.api_key, 0) + 1

    def record_error(self, message: str) -> None:
        self.errors += 1
        self.last_error = message
        self.last_error_at = time.time()

    def as_dict(self) -> dict[str, object]:
        return {
            "node_id": self.node_id,
            "advertised": self.advertised,
            "tunnel": self.local,
            "route": self.route,
            "state": self.state,
            "connections": self.connections,
            "total_connections": self.total_connections,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "requests": self.requests,
            "errors": self.errors,
            "last_error": self.last_error,
            "dns_address": self.dns_address,
            **self.extra,
        }


class BrokerRegistry:
    """Endpoints by node id. `on_new` is called, synchronously, for each new broker endpoint,
    so its listener exists before any client can learn its address."""

    def __init__(
        self,
        listen_host: str,
        bootstrap_port: int,
        fixed_ports: dict[int, int] | None = None,
        on_new: Callable[[Endpoint], None] | None = None,
        first_dns_address: str = "127.0.0.2",
    ) -> None:
        self.first_dns_address = ipaddress.IPv4Address(first_dns_address)
        self.listen_host = listen_host
        self.bootstrap_port = bootstrap_port
        self.fixed_ports = dict(fixed_ports or {})
        self.on_new = on_new
        self.brokers: dict[int, Endpoint] = {}
        self._next_index = 0

    def _port_for(self, node_id: int) -> int:
        if node_id in self.fixed_ports:
            return self.fixed_ports[node_id]
        taken = {e.listen_port for e in self.brokers.values()} | set(self.fixed_ports.values())
        while True:
            port = self.bootstrap_port + 1 + self._next_index
            self._next_index += 1
            if port not in taken:
                return port

    def learn(self, addresses: Iterable[BrokerAddress]) -> list[Endpoint]:
        """Register the brokers in `addresses` not known yet (in node-id order); update the
        advertised address of known ones that moved. Returns the new endpoints."""
        new = []
        for address in sorted(set(addresses), key=lambda a: a.node_id):
            known = self.brokers.get(address.node_id)
            if known is not None:
                if (known.advertised_host, known.advertised_port) != (address.host, address.port):
                    known.advertised_host, known.advertised_port = address.host, address.port
                continue
            endpoint = Endpoint(
                address.node_id,
                address.host,
                address.port,
                self.listen_host,
                self._port_for(address.node_id),
                dns_address=str(self.first_dns_address + len(self.brokers)),
            )
            self.brokers[address.node_id] = endpoint
            new.append(endpoint)
            if self.on_new is not None:
                self.on_new(endpoint)
        return new

    def map(self, address: BrokerAddress) -> tuple[str, int]:
        """The rewriter's mapper: the tunnel address standing for `address`; UnknownBroker
        for a broker not learnt yet, or one that moved (learn() first, then map again)."""
        endpoint = self.brokers.get(address.node_id)
        if (
            endpoint is None
            or endpoint.advertised_port != address.port
            or endpoint.advertised_host != address.host
        ):
            raise UnknownBroker(address)
        return endpoint.listen_host, endpoint.listen_port

    def is_tunnel_address(self, host: str, port: int) -> bool:
        return any((e.listen_host, e.listen_port) == (host, port) for e in self.brokers.values())
