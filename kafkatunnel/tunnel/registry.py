"""Which local address stands for which broker, and how each is doing.

Ports are stable per node id for the whole run: by default the bootstrap port + 1 + the
broker's index in node-id order (the first brokers seen are indexed together, in node-id
order; later ones take the next indexes), or what `--broker-port NODE=PORT` says.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kafkatunnel.hostnames import UntrustedName, check_address, join_address
from kafkatunnel.protocol import BrokerAddress, ProtocolError, UnknownBroker, api_title
from kafkatunnel.tunnel.limits import DEFAULT_MAX_BROKERS

log = logging.getLogger("kafkatunnel.registry")
REFUSALS_KEPT = 50  # refused brokers listed in status (all are counted)
# Node ids of refused brokers remembered, so an answer repeated (every metadata refresh)
# is not counted or logged again; past this many a hostile cluster gets no more memory.
REFUSED_REMEMBERED = 10_000


def refused_address(address: BrokerAddress) -> tuple[str, int]:
    """What clients are told for a refused broker: a name under `.invalid`, which RFC 6761
    reserves to never resolve, so a client fails at once and names the node in its log,
    instead of reaching an address the tunnel did not bind."""
    port = address.port if 0 < address.port < 65536 else 9092
    node = f"n{address.node_id}" if address.node_id >= 0 else "unknown"
    return f"refused-broker-{node}.kafkatunnel.invalid", port


@dataclass(frozen=True)
class Refusal:
    """A broker the cluster named that the tunnel will not serve, and why."""

    node_id: int
    advertised: str  # repr() of what it said: it may hold anything
    reason: str

    def as_dict(self) -> dict[str, object]:
        return {"node_id": self.node_id, "advertised": self.advertised, "reason": self.reason}


@dataclass
class Tally:
    """What connections did beyond bytes: requests per API key, answers rewritten, bytes
    spliced, coordinator answers' error codes. Summed over connections, open and closed."""

    rewrites: int = 0
    spliced: int = 0  # bytes moved without entering Python (splice)
    errors: dict[int, int] = field(default_factory=dict)
    requests: dict[int, int] = field(default_factory=dict)  # per API key
    refused: dict[int, int] = field(default_factory=dict)  # per API key (--read-only...)

    def add(self, other: Tally) -> None:
        self.rewrites += other.rewrites
        self.spliced += other.spliced
        for code, count in other.errors.items():
            self.errors[code] = self.errors.get(code, 0) + count
        for key, count in other.requests.items():
            self.requests[key] = self.requests.get(key, 0) + count
        for key, count in other.refused.items():
            self.refused[key] = self.refused.get(key, 0) + count

    def copy(self) -> Tally:
        return Tally(self.rewrites, self.spliced, dict(self.errors), dict(self.requests),
                     dict(self.refused))  # fmt: skip

    def by_api(self) -> dict[str, int]:
        """Requests per API by the name Kafka gives it (Fetch, ShareFetch...), in key order:
        what status and the metrics show."""
        return {api_label(key): count for key, count in sorted(self.requests.items())}

    def refused_by_api(self) -> dict[str, int]:
        """Requests refused per API (--read-only, --deny-api), named as in by_api."""
        return {api_label(key): count for key, count in sorted(self.refused.items())}


def api_label(api_key: int) -> str:
    """An API's name, or its key when this tunnel does not know it."""
    try:
        return api_title(api_key)
    except ProtocolError:
        return str(api_key)


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
    errors: int = 0
    dns_address: str | None = None  # its own loopback address, for the DNS shim
    last_error: str | None = None
    last_error_at: float | None = None
    note: str | None = None  # what the user should know, e.g. why its name is not resolved
    closed: Tally = field(default_factory=Tally)  # of its closed connections
    tls: dict[str, object] | None = None  # the last TLS session with it (--tls)
    login: dict[str, object] | None = None  # the tunnel's last login to it (SASL)

    @property
    def advertised(self) -> str:
        return join_address(self.advertised_host, self.advertised_port)

    @property
    def local(self) -> str:
        return join_address(self.listen_host, self.listen_port)

    def record_error(self, message: str) -> None:
        self.errors += 1
        self.last_error = message
        self.last_error_at = time.time()

    def as_dict(self, tally: Tally | None = None) -> dict[str, object]:
        """For status; `tally`: what its connections did, open and closed."""
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
            "requests": 0 if tally is None else sum(tally.requests.values()),
            "api_requests": {} if tally is None else tally.by_api(),
            "api_refused": {} if tally is None else tally.refused_by_api(),
            "errors": self.errors,
            "last_error": self.last_error,
            "dns_address": self.dns_address,
            "note": self.note,
            "tls": self.tls,
            "login": self.login,
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
        max_brokers: int = DEFAULT_MAX_BROKERS,
        advertise: str | None = None,
    ) -> None:
        """advertise: the host clients are told (default: the listen host)."""
        self.advertise = advertise
        self.first_dns_address = ipaddress.IPv4Address(first_dns_address)
        self.max_brokers = max_brokers
        self.refusals: dict[int, Refusal] = {}  # the first REFUSALS_KEPT, by node id
        self.refused_total = 0  # distinct node ids (up to REFUSED_REMEMBERED)
        self._refused_ids: set[int] = set()
        self.unserved: set[int] = set()  # node ids known, but with no listener
        self.listen_host = listen_host
        self.bootstrap_port = bootstrap_port
        self.fixed_ports = dict(fixed_ports or {})
        self.on_new = on_new
        self.brokers: dict[int, Endpoint] = {}
        self._next_index = 0

    def _port_for(self, node_id: int) -> int:
        if node_id in self.fixed_ports:
            return self.fixed_ports[node_id]
        return self.next_port()

    def next_port(self) -> int:
        """The next port of the run after the bootstrap port that no broker has."""
        taken = {e.listen_port for e in self.brokers.values()} | set(self.fixed_ports.values())
        taken.add(self.bootstrap_port)
        while True:
            port = self.bootstrap_port + 1 + self._next_index
            self._next_index += 1
            if port not in taken:
                return port

    def learn(self, addresses: Iterable[BrokerAddress]) -> list[Endpoint]:
        """Register the brokers in `addresses` not known yet (in node-id order); update the
        advertised address of known ones that moved. Returns the new endpoints.

        A name that is not a host name or IP literal, or a broker past `max_brokers`, is
        refused (one log line for the lot): it gets no listener and no forward, and
        clients are told an address that never resolves (`refused_address`)."""
        new = []
        refused: list[Refusal] = []
        for address in sorted(set(addresses), key=lambda a: a.node_id):
            why = self._refusal(address)
            if why is not None:
                refused.append(Refusal(address.node_id, repr(address.host), why))
                continue
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
        if refused:
            self._note(refused)
        return new

    def _refusal(self, address: BrokerAddress) -> str | None:
        """Why the tunnel will not serve `address` (None: it will)."""
        try:
            check_address(address.host, address.port)
        except UntrustedName as error:
            return str(error)
        if address.node_id not in self.brokers and len(self.brokers) >= self.max_brokers:
            return f"more than {self.max_brokers} brokers (raise the limit with --max-brokers)"
        return None

    def _note(self, refused: list[Refusal]) -> None:
        fresh = [r for r in refused if r.node_id not in self._refused_ids]
        self.refused_total += len(fresh)
        room = REFUSED_REMEMBERED - len(self._refused_ids)
        self._refused_ids.update(r.node_id for r in fresh[: max(room, 0)])
        for refusal in fresh:
            if len(self.refusals) < REFUSALS_KEPT:
                self.refusals[refusal.node_id] = refusal
        if fresh:
            first = fresh[0]
            more = f" (and {len(fresh) - 1} more)" if len(fresh) > 1 else ""
            log.error(
                "refused broker %d named %s by the cluster: %s%s; clients are told it "
                "does not resolve, the other brokers keep working",
                first.node_id, first.advertised, first.reason, more,
            )  # fmt: skip

    def map(self, address: BrokerAddress) -> tuple[str, int]:
        """The rewriter's mapper: the tunnel address standing for `address`; UnknownBroker
        for a broker not learnt yet, or one that moved (learn() first, then map again)."""
        endpoint = self.brokers.get(address.node_id)
        if (
            endpoint is not None
            and endpoint.node_id not in self.unserved
            and endpoint.advertised_port == address.port
            and endpoint.advertised_host == address.host
        ):
            return self.advertise or endpoint.listen_host, endpoint.listen_port
        if (
            address.node_id in self.unserved
            or self._refusal(address) is not None  # decided again: not all are kept
        ):
            return refused_address(address)
        raise UnknownBroker(address)

    def unlisten(self, endpoint: Endpoint) -> None:
        """`endpoint` could not get a listener: clients must not be told its address."""
        if endpoint.node_id is not None:
            self.unserved.add(endpoint.node_id)
