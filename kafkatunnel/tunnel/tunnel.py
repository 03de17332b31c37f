"""The tunnel: a bootstrap listener, one listener per broker, and the connections between.

tunnel = Tunnel(TunnelConfig(bootstrap="kafka-0.kafka:9092"), ExecForwarder("..."))
await tunnel.start()   # binds, learns the brokers, starts the control endpoint
print(tunnel.bootstrap_servers)
await tunnel.stop()
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import os
import socket
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafkatunnel.capture.recorder import DEFAULT_ROTATE_BYTES, Listener, Recorder, Recording
from kafkatunnel.dns.names import Zone
from kafkatunnel.dns.server import DnsServer
from kafkatunnel.hostnames import (
    DEFAULT_CLUSTER_DOMAIN,
    OUTSIDE_ZONES,
    ClusterZones,
    UntrustedName,
    check_address,
    check_host,
    derived_zone,
    is_ip_literal,
    join_address,
    split_address,
)
from kafkatunnel.probe import ProbeConnection, wanted_login
from kafkatunnel.protocol import (
    COORDINATOR_ERRORS,
    DEFAULT_MAX_FRAME_SIZE,
    LOGIN_APIS,
    BrokerAddress,
    Exchange,
    Isolation,
    Mapper,
    PassThrough,
    Policy,
    ProtocolError,
    RequestHeader,
    RewrittenAnswers,
    api_title,
    isolating_caps,
    narrowest,
    readable_caps,
    rewrite_caps,
)
from kafkatunnel.ratelimit import RateLimitedLog
from kafkatunnel.tunnel.companions import Companions
from kafkatunnel.tunnel.control import ControlServer
from kafkatunnel.tunnel.deployed import DeployedOffsets
from kafkatunnel.tunnel.discovery import probe_brokers, probe_login
from kafkatunnel.tunnel.failure_log import REPEAT_WINDOW, FailureLog
from kafkatunnel.tunnel.forwarders import Forwarder, Upstream
from kafkatunnel.tunnel.limits import DEFAULT_MAX_BROKERS, DEFAULT_MAX_CONNECTIONS
from kafkatunnel.tunnel.listeners import Acceptor, PortInUse, bind_listener
from kafkatunnel.tunnel.login import Credentials, LoginForwarder
from kafkatunnel.tunnel.login_users import LoginUsers
from kafkatunnel.tunnel.proxy import LINGER, Address, ClientConnection
from kafkatunnel.tunnel.reachability import Unreachable, reach
from kafkatunnel.tunnel.registry import BrokerRegistry, Endpoint, Tally
from kafkatunnel.tunnel.tls import ClientTls, TlsForwarder

log = logging.getLogger("kafkatunnel.tunnel")
PORT_ATTEMPTS = 100  # ports tried for a broker whose own is taken
# (client id, API) pairs whose refusal was logged; past this many, refusals are only counted.
REFUSALS_SAID = 10_000

MODES = ("rewrite", "transparent")
MAX_PORTS = 65535
LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")  # broker i's DNS address: the first + i


class SettingError(ValueError):
    """A setting the tunnel cannot run with; `flag` is the `up` flag that sets it."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(message)
        self.flag = flag


@dataclass(frozen=True)
class Audience:
    """Clients served on another address besides the listen address (containers on a
    bridge): where the tunnel listens for them, on the same ports, and the host they are
    told in answers."""

    listen: str
    advertise: str

    @property
    def name(self) -> str:
        return f"{self.listen} (told {self.advertise})"


@dataclass
class TunnelConfig:
    bootstrap: str  # advertised HOST:PORT of a broker to start from
    listen_host: str = "127.0.0.1"
    listen_port: int = 9092
    broker_ports: dict[int, int] = field(default_factory=dict)
    connect_timeout: float = 10.0
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    control: bool = True  # serve status and metrics on the owner's control socket
    metrics_listen: tuple[str, int] | None = None  # also /metrics over TCP, for Prometheus
    discover_timeout: float = 10.0
    discover_at_start: bool = True  # off: brokers are learned only from clients' traffic
    mode: str = "rewrite"  # or "transparent": bytes pass untouched (TLS, SASL end to end)
    dns_listen: tuple[str, int] | None = None  # serve the brokers' names here
    dns_sockets: tuple[socket.socket, socket.socket] | None = None  # bound already (root)
    first_dns_address: str = "127.0.0.2"  # broker i gets this address + i
    brokers: list[str] = field(default_factory=list)  # advertised HOST:PORT known up front
    record_dir: Path | None = None  # write pcapng recordings here
    record_rotate_bytes: int = DEFAULT_ROTATE_BYTES
    record_payloads: bool = False  # keep Produce/Fetch record data in recordings
    zero_copy: bool = True  # splice bytes that pass unread (Linux); off: read every byte
    start_timeout: float | None = None  # wait this long for the bootstrap broker to answer
    max_brokers: int = DEFAULT_MAX_BROKERS  # brokers learned past this are refused
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # client connections held at once
    dns_zones: list[str] = field(default_factory=list)  # resolved besides the derived zones
    namespaces: list[str] = field(default_factory=list)  # the user's: their short names resolve
    resolver_zones: ClusterZones | None = None  # what sudo's root helper allows, if it sets up
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
    tls: ssl.SSLContext | None = None  # speak TLS to the brokers (rewrite mode) with this
    tls_certificate: str | None = None  # the client certificate `tls` presents, as named
    client_tls: ClientTls | None = None  # serve clients TLS, with a CA of the tunnel's own
    login: Credentials | None = None  # log in to the brokers for the clients (SASL)
    advertise: str | None = None  # the host clients are told, if not the listen host
    audiences: list[Audience] = field(default_factory=list)  # also served (containers)
    policy: Policy | None = None  # requests refused (--read-only, --deny-api, --allow-api)
    isolation: Isolation | None = None  # the clients' group and transactional ids mapped
    repeat_window: float = REPEAT_WINDOW  # seconds a repeated connection failure is counted
    target: dict[str, str] = field(default_factory=dict)  # the cluster, as the user named it

    def __post_init__(self) -> None:
        """The one check of the tunnel's settings: each error names the flag at fault."""
        _check(self.mode in MODES, "--mode", f"{self.mode!r} is not one of {', '.join(MODES)}")
        transparent = self.mode == "transparent"
        _check(not (transparent and self.tls is not None), "--tls", _FOR_REWRITE)
        _check(not (transparent and self.client_tls is not None), "--client-tls", _FOR_REWRITE)
        _check(not (transparent and self.login is not None), "--sasl-mechanism",
               "the tunnel logs in for its clients in rewrite mode: transparent mode passes "
               "the clients' own login through")  # fmt: skip
        _check(not transparent or self.dns_listen is not None, "--dns",
               "transparent mode needs the DNS shim (--dns): clients keep the brokers' own "
               "names")  # fmt: skip
        _check(
            not (transparent and self.isolation is not None),
            "--isolate",
            "--isolate is for rewrite mode: transparent mode passes requests unread",
        )
        _check(not (transparent and self.policy is not None), "--read-only",
               "--read-only, --deny-api and --allow-api are for rewrite mode: transparent "
               "mode passes requests unread")  # fmt: skip
        _check(not (transparent and self.audiences), "--for-containers",
               "containers are served in rewrite mode (transparent mode keeps the brokers' "
               "own names)")  # fmt: skip
        _check(1 <= self.max_brokers <= MAX_PORTS, "--max-brokers",
               f"must be from 1 to {MAX_PORTS} (each broker takes a port)")  # fmt: skip
        _check(self.max_connections >= 1, "--max-connections", "must be 1 or more")
        _check(0 < self.connect_timeout < math.inf, "--connect-timeout",
               "must be a number of seconds more than 0")  # fmt: skip
        _check(self.start_timeout is None or 0 <= self.start_timeout < math.inf,
               "--start-timeout", "must be a number of seconds, 0 or more")  # fmt: skip
        for flag, address in [("--bootstrap", self.bootstrap),
                              *(("--broker", b) for b in self.brokers)]:  # fmt: skip
            try:
                host, _ = check_address(*split_address(address))
                derived_zone(host)  # refuses a Kubernetes name in a public suffix
            except ValueError as cause:
                example = "e.g. kafka-0.kafka-headless.shop.svc.cluster.local:9092"
                raise SettingError(flag, f"{address!r}: expected the advertised HOST:PORT "
                                   f"of a broker, {example} ({cause})") from None  # fmt: skip
        for told in [self.advertise, *(a.advertise for a in self.audiences)]:
            try:
                if told is not None:
                    check_host(told)
            except UntrustedName as cause:
                raise SettingError("--advertise", str(cause)) from None
        _check_loopback_range(self.first_dns_address, self.max_brokers)
        for zone in self.dns_zones:
            try:
                ClusterZones.of([], [zone])
            except ValueError as cause:
                raise SettingError("--dns-zone", str(cause)) from None

    @property
    def told_hosts(self) -> tuple[str, ...]:
        """Every host clients reach the tunnel by, besides the listen host (the names a
        --client-tls certificate must hold)."""
        told = [self.advertise, *(h for a in self.audiences for h in (a.listen, a.advertise))]
        return tuple(h for h in told if h is not None)

    @property
    def zones(self) -> ClusterZones:
        """Where names may resolve: the zones of the names the user gave, never a broker's.
        Under sudo, exactly those the root helper checks against (it knew the user's names
        before a bootstrap was found), so the tunnel never asks for what it refuses."""
        if self.resolver_zones is not None:
            return self.resolver_zones
        names = [split_address(a)[0] for a in (self.bootstrap, *self.brokers)]
        return ClusterZones.of(names, self.dns_zones, self.cluster_domain, self.namespaces)


def login_note(mechanisms: tuple[str, ...], protocol: str | None) -> str:
    """What the tunnel says of a bootstrap listener that wants a SASL login (`mechanisms`,
    as it named them) before it lists the brokers; `protocol`: the security.protocol its
    clients set, None in transparent mode."""
    said = f"SASL {'/'.join(mechanisms)}" if mechanisms else "SASL"
    wants = f"the bootstrap broker's listener wants a login ({said}) before it lists the brokers"
    if protocol is None:  # clients' logins pass unread: the tunnel never sees the brokers
        return f"{wants}: name every broker with --broker HOST:PORT"
    settings = "".join(f", sasl.mechanism={m}" for m in mechanisms[:1])
    return (f"{wants}: they are added when a client has logged in through the tunnel (clients "
            f"set security.protocol={protocol}{settings})")  # fmt: skip


_FOR_REWRITE = (
    "--tls and --client-tls are for rewrite mode: transparent mode passes the "
    "clients' own TLS through"
)


def _check(holds: bool, flag: str, message: str) -> None:
    if not holds:
        raise SettingError(flag, message)


def _check_loopback_range(first: str, brokers: int) -> None:
    """Broker i's DNS address is `first` + i: every one of them on IPv4 loopback."""
    flag = "--dns-first-address"
    try:
        address = ipaddress.IPv4Address(first)
    except ValueError:
        raise SettingError(flag, f"{first!r} is not an IPv4 address, e.g. 127.0.0.2") from None
    _check(address in LOOPBACK, flag,
           f"{first} is not on loopback (127.0.0.0/8), where brokers get addresses")  # fmt: skip
    last = LOOPBACK.broadcast_address - 1
    room = int(last) - int(address) + 1
    _check(room >= brokers, flag,
           f"from {first} to {last} there are addresses for {room} brokers, not the "
           f"{brokers} of --max-brokers: choose a lower address")  # fmt: skip


class Tunnel:
    def __init__(
        self, config: TunnelConfig, forwarder: Forwarder, companions: Companions | None = None
    ) -> None:
        """`companions`: the services beside the brokers to serve too (a Schema Registry,
        Connect)."""
        self.config = config
        self.companions = companions
        if config.tls is not None:
            forwarder = TlsForwarder(forwarder, config.tls, config.tls_certificate,
                                     config.connect_timeout)  # fmt: skip
        self.login: LoginForwarder | None = None
        if config.login is not None:  # after TLS: the login goes inside it
            forwarder = self.login = LoginForwarder(forwarder, config.login,
                                                    config.connect_timeout)  # fmt: skip
        self.forwarder = forwarder
        self.client_tls = config.client_tls
        host, port = split_address(config.bootstrap)
        self.bootstrap = Endpoint(None, host, port, config.listen_host, config.listen_port)
        self.bootstrap.route = forwarder.describe(host, port)
        self.registry = BrokerRegistry(
            config.listen_host,
            config.listen_port,
            config.broker_ports,
            on_new=self._open_broker,
            first_dns_address=config.first_dns_address,
            max_brokers=config.max_brokers,
            advertise=config.advertise,
        )
        self.zones = config.zones
        self.transparent = config.mode == "transparent"
        self.zone = Zone()
        self.dns: DnsServer | None = None
        if config.dns_listen is not None:
            self.dns = DnsServer(self.zone, *config.dns_listen, sockets=config.dns_sockets)
        # Clients may use only versions the tunnel can rewrite; while it records, only
        # versions it can read, or the recording would leave their requests out.
        readable = readable_caps() if config.record_dir is not None else {}
        # What each connection refuses: the user's policy and, when the tunnel logs in,
        # the client's own login (answered by the tunnel: it never reaches the broker)
        self.policy = Policy.guarding(config.policy, self._login_named,
                                      config.isolation is not None)  # fmt: skip
        # ... and only versions it can refuse with an answer, of the APIs a policy holds
        held = {} if self.policy is None else self.policy.caps()
        # ... and, isolating, only versions whose ids this tunnel can see
        isolating = {} if config.isolation is None else isolating_caps()
        self.caps = narrowest(readable, rewrite_caps(), held, isolating)
        # the group ids clients named, isolated (status; `down --clean` deletes them)
        self.isolated_groups: set[str] = set()
        # --isolate-from-deployed: what asks the deployed groups for their offsets
        self.deployed = (
            DeployedOffsets(self.forwarder, self.bootstrap, self.registry, config.connect_timeout)
            if config.isolation is not None and config.isolation.from_deployed
            else None
        )
        # Answers rewritten before, per audience (None: the tunnel's own addresses)
        self._answers: dict[str | None, RewrittenAnswers] = {}
        self.connections: set[ClientConnection] = set()
        self.acceptors: list[Acceptor] = []
        self.control: ControlServer | None = None
        self.started_at = time.time()
        # start() is done: the brokers asked for, and what the clients must do learned
        # (client_login); status is served from before, while they are asked
        self.started = False
        self.notes: list[str] = []
        # the login the clients must make themselves (the tunnel makes none for them), as
        # the bootstrap listener asked for it: what `env` and `run` hand a client
        self.client_login: dict[str, Any] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self._draining: set[Upstream] = set()  # closed, their process or socket not yet gone
        self._loop: asyncio.AbstractEventLoop | None = None
        self.recorder: Recorder | None = None
        # pinned broker ports, bound at start: the listen address's, then each audience's
        self._claimed: dict[int, list[socket.socket]] = {}
        self.turned_away = 0  # connections closed at accept: too many open
        self.login_users: LoginUsers | None = None  # whose clients it logs in (with a login)
        self._refusals_said: set[tuple[str | None, int]] = set()  # (client id, API) logged
        self._full_log = RateLimitedLog(log, "%d client connection(s) closed at accept%s: %s")
        self.failures = FailureLog(config.repeat_window)  # connections' failures, in the log

    @property
    def bootstrap_servers(self) -> str:
        """What clients of the listener are told: the advertised host (--advertise, else the
        listen address) and the bootstrap port."""
        host = self.config.advertise or self.config.listen_host
        return join_address(host, self.config.listen_port)

    @property
    def client_bootstrap(self) -> str:
        """What clients put in bootstrap.servers: the tunnel's listener or, in transparent
        mode (TLS hostname checks, Kerberos), a broker's own name, which the shim resolves."""
        return self.bootstrap.advertised if self.transparent else self.bootstrap_servers

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self.forwarder.prepare()
        try:
            if self.companions is not None:
                await self.companions.start(
                    self._accepted_by_companion,
                    self.zone if self.dns is not None else None,
                    self.companion_first_address,
                    self.zones,
                    tuple(a.listen for a in self.config.audiences),
                )
            await self._start_brokers()
        except BaseException:
            if self.companions is not None:  # its listeners and the forwards it started
                self.companions.close()
                await self.companions.forwarder.close()
            raise

    @property
    def companion_first_address(self) -> str:
        """Services' own loopback addresses start past every broker's (with --dns)."""
        first = ipaddress.IPv4Address(self.config.first_dns_address)
        return str(first + self.config.max_brokers)

    async def _start_brokers(self) -> None:
        sock = bind_listener(self.config.listen_host, self.config.listen_port, "--listen HOST:PORT")
        others: list[socket.socket] = []
        try:
            for audience in self.config.audiences:
                flag = f"--listen HOST:PORT, for {audience.name}"
                others.append(bind_listener(audience.listen, self.config.listen_port, flag))
            if not self.transparent:
                self._claim_pinned_ports()
        except BaseException:
            for bound in [sock, *others]:
                bound.close()
            raise
        if self.config.start_timeout is not None:
            try:
                await self.reach_bootstrap(self.config.start_timeout)
            except BaseException:
                for bound in [sock, *others]:
                    bound.close()
                self._release_claims()
                raise
        identity = self._identity
        if identity is not None:  # known before the first client, said by `up` at start
            self.login_users = LoginUsers(identity)
        if self.config.record_dir is not None:
            self.recorder = Recorder(
                self.config.record_dir, self.config.record_rotate_bytes, self.config.record_payloads
            )
        await self._serve(sock, self.bootstrap)
        for other, audience in zip(others, self.config.audiences, strict=True):
            await self._serve(other, self.bootstrap, audience)
        if self.dns is not None:
            await self.dns.start()
        if self.config.control:
            self.control = ControlServer(
                self.status, self.metrics, self.config.listen_port, self.config.metrics_listen
            )
            await self.control.start()
        known = [split_address(b) for b in self.config.brokers]
        self.registry.learn(BrokerAddress(i, h, p) for i, (h, p) in enumerate(known))
        if self.config.discover_at_start and not known:
            if self.transparent or self.client_tls is not None:  # our listeners: not plaintext
                await self.discover_directly()
            else:
                await self.discover()
        self.started = True

    def _claim_pinned_ports(self) -> None:
        """Bind every --broker-port now: a taken one is an error at start, not a port
        handed to clients while someone else holds it."""
        try:
            for node_id, port in sorted(self.config.broker_ports.items()):
                flag = f"--broker-port {node_id}=PORT"
                self._claimed[node_id] = claimed = []
                for host in self.listen_hosts:
                    claimed.append(bind_listener(host, port, flag))
        except BaseException:
            self._release_claims()
            raise

    def _release_claims(self) -> None:
        for socks in self._claimed.values():
            for sock in socks:
                sock.close()
        self._claimed.clear()

    @property
    def listen_hosts(self) -> list[str]:
        """Every address a broker's port is bound on: the listen address, then each
        audience's, in that order."""
        return [self.config.listen_host, *(a.listen for a in self.config.audiences)]

    async def reach_bootstrap(self, timeout: float) -> None:
        """Until the bootstrap broker answers through the forwarder (Unreachable, naming the
        forwarder's cause, after `timeout` seconds)."""
        host, port = self.bootstrap.advertised_host, self.bootstrap.advertised_port

        def waiting(cause: str) -> None:
            log.warning("waiting up to %gs for %s:%d to answer: %s", timeout, host, port, cause)

        await reach(self.forwarder, host, port, timeout, self.transparent, on_retry=waiting)

    async def discover_directly(self) -> bool:
        """Transparent mode: a plaintext Metadata request through the forwarder (the
        clients' own connections are never read). A TLS cluster needs --broker instead."""
        host, port = self.bootstrap.advertised_host, self.bootstrap.advertised_port
        timeout = self.config.discover_timeout
        try:
            brokers = await probe_brokers(self.forwarder, host, port, timeout)
        except (OSError, ConnectionError, TimeoutError, ProtocolError) as error:
            login = None
            if isinstance(error, ConnectionError):  # closed unanswered: a login first?
                login = await probe_login(self.forwarder, host, port, timeout)
            cause = error or "timed out"
            if login is not None:
                protocol = None if self.transparent else "SASL_SSL"
                note = login_note(login, protocol)
                self._clients_log_in(login, protocol)
            elif self.transparent:
                note = (f"could not list the brokers with a plaintext request ({cause}); with "
                        "TLS, name every broker with --broker HOST:PORT")  # fmt: skip
            else:
                note = f"could not list the brokers yet ({cause}); they will be added on first use"
            self.notes.append(note)
            log.warning(note)
            return False
        self.registry.learn(brokers)
        return bool(brokers)

    async def discover(self) -> bool:
        """Ask the cluster for its brokers through our own bootstrap listener, so every
        broker has its listener before any client asks. False (with a note) if unreachable."""
        address = self.bootstrap.local

        def ask() -> list[BrokerAddress]:
            with ProbeConnection(address, timeout=self.config.discover_timeout) as probe:
                return probe.brokers()

        try:
            brokers = await asyncio.to_thread(ask)
        except (OSError, ConnectionError, ProtocolError, ValueError) as error:
            login = None
            if isinstance(error, ConnectionError):  # closed unanswered: a login first?
                login = await asyncio.to_thread(wanted_login, address, self.config.discover_timeout)
            note = (f"could not list the brokers yet ({error}); they will be added on first use"
                    if login is None else login_note(login, "SASL_PLAINTEXT"))  # fmt: skip
            if login is not None:
                self._clients_log_in(login, "SASL_PLAINTEXT")
            self.notes.append(note)
            log.warning(note)
            return False
        return len(brokers) > 0

    def _clients_log_in(self, mechanisms: tuple[str, ...], protocol: str | None) -> None:
        """Clients log in themselves, over `protocol` (None: transparent mode, where their
        own settings already say how), with one of `mechanisms`."""
        if protocol is not None:
            self.client_login = {"security_protocol": protocol, "mechanisms": list(mechanisms)}
        if self.deployed is not None:
            note = (
                "--isolate-from-deployed: the tunnel cannot read the deployed groups' offsets "
                "without a login of its own (--sasl-mechanism and its user): isolated groups "
                "start where their clients' auto.offset.reset says"
            )
            self.notes.append(note)
            log.warning(note)

    async def stop(self) -> None:
        self._release_claims()
        for acceptor in self.acceptors:
            acceptor.close()
        if self.companions is not None:
            self.companions.close()
        connections = list(self.connections)
        for connection in connections:
            connection.close()  # once it has let go, its upstream joins _draining
        if connections:
            waits = [asyncio.ensure_future(c.wait_closed()) for c in connections]
            await asyncio.wait(waits, timeout=LINGER + 1)
        if self._draining:
            waits = [asyncio.ensure_future(u.wait_closed()) for u in self._draining]
            await asyncio.wait(waits, timeout=5)
        for task in list(self._pending):
            task.cancel()
        await asyncio.sleep(0)  # let cancelled tasks finish
        self.failures.close()  # the repeats not said yet
        if self.login_users is not None:
            self.login_users.close()
        if self.control is not None:
            await self.control.stop()
        if self.dns is not None:
            await self.dns.stop()
        await self.forwarder.close()
        if self.companions is not None:
            await self.companions.forwarder.close()
        if self.recorder is not None:
            self.recorder.close()

    # -- listeners --------------------------------------------------------------------------

    async def _serve(
        self, sock: socket.socket, endpoint: Endpoint, audience: Audience | None = None
    ) -> None:
        """Accept clients on `sock` for `endpoint`; those of an audience are told its host.
        A recording describes the listener from now on, whether or not a client comes: an
        address clients are told is the tunnel's even when none of them connects to it."""
        if self.recorder is not None:
            self.recorder.interface(self._listener(endpoint))
        acceptor = Acceptor(sock, lambda conn: self._accepted(endpoint, conn, audience))
        acceptor.start()
        self.acceptors.append(acceptor)
        endpoint.state = "listening"

    def _open_broker(self, endpoint: Endpoint) -> None:
        """Bind a new broker's listeners right away (called while a response naming it is
        being rewritten); accepting starts on the next turn of the event loop.

        Rewrite mode listens on 127.0.0.1:<its port> (the next free one when that is taken:
        clients are only ever told addresses the tunnel holds); with DNS, also on the
        broker's own loopback address and advertised port, which its names resolve to, if
        its name is inside the cluster's zones. Transparent mode listens only there, and
        passes bytes untouched."""
        endpoint.route = self.forwarder.describe(endpoint.advertised_host, endpoint.advertised_port)
        sockets: list[tuple[socket.socket, Audience | None]] = []
        if not self.transparent:
            bound = self._bind_broker_port(endpoint)
            if bound is None:
                return
            sockets += zip(bound, [None, *self.config.audiences], strict=True)
        if self.dns is not None and endpoint.dns_address is not None:
            named = self._bind_name(endpoint)
            if named is not None:
                sockets.append((named, None))
            elif self.transparent:  # its name leads nowhere: nothing to serve
                endpoint.state = "not resolved"
                return
        self.forwarder.expect(endpoint.advertised_host, endpoint.advertised_port)
        assert self._loop is not None
        for sock, audience in sockets:
            task = self._loop.create_task(self._serve(sock, endpoint, audience))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        log.info("broker %s %s -> %s", endpoint.node_id, endpoint.advertised, endpoint.local)

    def _bind_name(self, endpoint: Endpoint) -> socket.socket | None:
        """The listener on the broker's own loopback address and advertised port, its name
        added to the shim's zone; None (with a note saying why) when its name is not
        resolved: an address, outside the cluster's zones, or that port taken there."""
        host = endpoint.advertised_host
        if is_ip_literal(host):
            endpoint.note = "advertised as an address: no name to resolve"
            return None
        if not self.zones.covers(host):
            endpoint.note = f"{OUTSIDE_ZONES} ({self.zones}; add one with --dns-zone)"
            log.warning("broker %s %s: %s", endpoint.node_id, endpoint.advertised, endpoint.note)
            return None
        assert endpoint.dns_address is not None
        try:
            sock = bind_listener(
                endpoint.dns_address, endpoint.advertised_port, "--dns-first-address"
            )
        except PortInUse as error:
            endpoint.note = f"not resolved: {error}"
            log.error("broker %s: %s", endpoint.node_id, endpoint.note)
            return None
        self.zone.add(self.zones.names_of(host), endpoint.dns_address)
        if self.transparent:
            endpoint.listen_host, endpoint.listen_port = sock.getsockname()[:2]
        return sock

    def _bind_broker_port(self, endpoint: Endpoint) -> list[socket.socket] | None:
        """The broker's rewrite-mode listeners, one per listen address (see listen_hosts),
        all on one port: its pinned or planned one, else the next free everywhere (a pinned
        port was claimed at start, so it cannot be taken here)."""
        claimed = (
            self._claimed.pop(endpoint.node_id, None) if endpoint.node_id is not None else None
        )
        if claimed is not None:
            return claimed
        pinned = endpoint.node_id in self.config.broker_ports
        flag = f"--broker-port {endpoint.node_id}=PORT"
        for _ in range(PORT_ATTEMPTS):
            bound: list[socket.socket] = []
            try:
                for host in self.listen_hosts:
                    bound.append(bind_listener(host, endpoint.listen_port, flag))
                return bound
            except PortInUse as error:
                for sock in bound:
                    sock.close()
                if pinned:
                    self._cannot_listen(endpoint, str(error), [])
                    return None
                taken = endpoint.listen_port
                endpoint.listen_port = self.registry.next_port()
                log.warning("broker %s: port %d is taken, using %d",
                            endpoint.node_id, taken, endpoint.listen_port)  # fmt: skip
        self._cannot_listen(endpoint, f"no free port in {PORT_ATTEMPTS} tries", [])
        return None

    def _cannot_listen(self, endpoint: Endpoint, why: str, bound: list[socket.socket]) -> None:
        """A broker that gets no listener: clients are told it does not resolve."""
        for sock in bound:
            sock.close()
        endpoint.state = "port in use"
        endpoint.record_error(why)
        self.registry.unlisten(endpoint)
        log.error("broker %s: %s", endpoint.node_id, why)

    def _accepted(
        self, endpoint: Endpoint, sock: socket.socket, audience: Audience | None = None
    ) -> None:
        if self._admitted(sock) and self._may_log_in(endpoint, sock):
            self._connection(endpoint, audience).start(sock)

    def _may_log_in(self, endpoint: Endpoint, sock: socket.socket) -> bool:
        """False (the socket closed before a byte of it is read, said and counted) for a
        client of another user's when the tunnel logs in (see LoginUsers)."""
        refusal = None if self.login_users is None else self.login_users.refusal(sock)
        if refusal is None:
            return True
        sock.close()
        endpoint.record_error(refusal.message)
        self.failures.warn(endpoint.local, refusal.message, refusal.peer,
                           "were refused the same way")  # fmt: skip
        return False

    def _accepted_by_companion(self, endpoint: Endpoint, sock: socket.socket) -> None:
        """A client of a service beside the brokers: its bytes pass untouched."""
        if not self._admitted(sock):
            return
        assert self.companions is not None
        connection = ClientConnection(
            endpoint,
            self.companions.forwarder,
            lambda _: PassThrough(),
            self.config.connect_timeout,
            self._closed,
            self.failures,
            zero_copy=self.config.zero_copy,
        )
        self.connections.add(connection)
        connection.start(sock)

    def _admitted(self, sock: socket.socket) -> bool:
        """False (the socket closed, counted and said) past --max-connections."""
        if len(self.connections) < self.config.max_connections:
            return True
        sock.close()
        self.turned_away += 1
        self._full_log.note(
            f"{self.config.max_connections} client connections are open: new ones are "
            "closed at once (raise --max-connections, or find the client that leaks them)"
        )
        return False

    def _connection(self, endpoint: Endpoint, audience: Audience | None) -> ClientConnection:
        connection = ClientConnection(
            endpoint,
            self.forwarder,
            lambda served: self._exchange(served, audience),
            self.config.connect_timeout,
            self._closed,
            self.failures,
            self._record if self.recorder is not None else None,
            self.config.zero_copy,
            learn=self.registry.learn,
            client_tls=None if self.client_tls is None else self.client_tls.context,
            on_refused=None if self.policy is None else self._refused,
            login=self._login_named,
            ask_deployed=None if self.deployed is None else self.deployed.answers,
        )
        self.connections.add(connection)
        return connection

    def _refused(self, connection: ClientConnection, headers: Sequence[RequestHeader]) -> None:
        """Say once per client (by its client id) and API that its requests are refused:
        status and metrics count every one."""
        policy = self.policy
        assert policy is not None
        for header in headers:
            if header.api_key in LOGIN_APIS:
                continue  # its own login: the connection says so (ClientConnection._own_login)
            said = (header.client_id, header.api_key)
            if said in self._refusals_said or len(self._refusals_said) >= REFUSALS_SAID:
                continue
            self._refusals_said.add(said)
            try:
                api = api_title(header.api_key)
            except ProtocolError:
                api = f"API {header.api_key}"
            log.warning("refused %s from client %r (%s) at %s: %s; further refusals of it are "
                        "counted in status", api, header.client_id, connection.peer,
                        connection.endpoint.local, policy.reason_for(header.api_key))  # fmt: skip

    @property
    def _identity(self) -> str | None:
        """Who the tunnel is to the brokers for its clients, if anyone: its SASL login, or
        the client certificate it presents."""
        certificate = self.config.tls_certificate
        if self._login_named is not None or certificate is None:
            return self._login_named
        return f"the client certificate of {certificate}"

    @property
    def _login_named(self) -> str | None:
        """Who the tunnel logs in as, for messages: `alice (SCRAM-SHA-512)`."""
        login = self.config.login
        return None if login is None else f"{login.username} ({login.mechanism})"

    def _record(self, endpoint: Endpoint, client: Address, local: Address) -> Recording:
        assert self.recorder is not None
        return self.recorder.connection(self._listener(endpoint), client, local)

    def _listener(self, endpoint: Endpoint) -> Listener:
        """The endpoint as a recording describes it."""
        isolation = self.config.isolation
        return Listener(endpoint.node_id, endpoint.advertised, endpoint.local, self.config.mode,
                        None if isolation is None else isolation.suffix)  # fmt: skip

    def _closed(self, connection: ClientConnection) -> None:
        """Forget a closed connection, but keep its upstream until it is really gone, so
        stop() can wait for it (an exec forwarder's child must be reaped by this loop)."""
        self.connections.discard(connection)
        connection.endpoint.closed.add(connection.tally())
        upstream = connection.upstream
        if upstream is None or self._loop is None:
            return
        self._draining.add(upstream)
        task = self._loop.create_task(upstream.wait_closed())
        task.add_done_callback(lambda _: self._draining.discard(upstream))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _exchange(self, endpoint: Endpoint, audience: Audience | None) -> Exchange | PassThrough:
        if self.transparent:
            return PassThrough()
        told = None if audience is None else audience.advertise
        return Exchange(
            self.registry.map if told is None else self._told(told),
            self.caps,
            max_frame_size=self.config.max_frame_size,
            # a recording without payloads keeps no record data: let it pass unread
            records_only=self.recorder is not None and not self.recorder.payloads,
            answers=self._answers.setdefault(told, RewrittenAnswers()),  # one per audience
            policy=self.policy,
            isolation=self.config.isolation,
            groups=self.isolated_groups,
        )

    def _told(self, advertise: str) -> Mapper:
        """The mapper for an audience: the tunnel's addresses, with its host in them."""
        ours = self.config.advertise or self.config.listen_host

        def mapper(address: BrokerAddress) -> tuple[str, int]:
            host, port = self.registry.map(address)
            return (advertise, port) if host == ours else (host, port)

        return mapper

    def audience_bootstraps(self) -> dict[str, str]:
        """bootstrap.servers for each audience (by its listen address)."""
        port = self.config.listen_port
        return {a.listen: join_address(a.advertise, port) for a in self.config.audiences}

    # -- reporting --------------------------------------------------------------------------

    def _companion_metrics(self) -> list[str]:
        """Per service beside the brokers: connections, bytes, forward restarts."""
        if self.companions is None or not self.companions.served:
            return []
        forwarder = self.companions.forwarder
        endpoints = [c.endpoint for c in self.companions.served]
        lines = []
        for name, kind, value in (
            ("kafkatunnel_service_connections", "gauge", lambda e: e.connections),
            ("kafkatunnel_service_connections_total", "counter", lambda e: e.total_connections),
            ("kafkatunnel_service_client_bytes_total", "counter", lambda e: e.bytes_in),
            ("kafkatunnel_service_bytes_total", "counter", lambda e: e.bytes_out),
            ("kafkatunnel_service_errors_total", "counter", lambda e: e.errors),
            ("kafkatunnel_service_forward_restarts_total", "counter",
             lambda e: forwarder.restarts(e.advertised_host, e.advertised_port)),
            ("kafkatunnel_service_forward_replacements_total", "counter",
             lambda e: forwarder.replacements(e.advertised_host, e.advertised_port)),
        ):  # fmt: skip
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{{{_service_labels(e)}}} {value(e)}" for e in endpoints)
        return lines

    def endpoints(self) -> list[Endpoint]:
        return [self.bootstrap, *sorted(self.registry.brokers.values(), key=_node)]

    def status(self) -> dict[str, Any]:
        endpoints = self.endpoints()
        tallies = self._tallies(endpoints)
        for endpoint in endpoints:  # forwards change state: describe them now
            host, port = endpoint.advertised_host, endpoint.advertised_port
            endpoint.route = self.forwarder.describe(host, port)
            endpoint.tls = self.forwarder.session(host, port)
            endpoint.login = None if self.login is None else self.login.login(host, port)
        return {
            "bootstrap_servers": self.bootstrap_servers,
            "via": self.forwarder.kind,
            "target": self.config.target,  # what `run` joins by
            "pid": os.getpid(),
            "started_at": self.started_at,
            "started": self.started,
            "mode": self.config.mode,
            # what the tunnel refuses (--read-only, --deny-api), None: nothing
            "policy": None
            if self.config.policy is None
            else {
                "read_only": self.config.policy.read_only,
                "refused_apis": self.config.policy.names(),
                "refused": sum(sum(t.refused.values()) for t in tallies.values()),
            },
            "notes": self.notes,
            # --isolate: the suffix, and the groups clients used, as they named them (the
            # cluster has each as NAME.SUFFIX)
            "isolation": None
            if self.config.isolation is None
            else {"suffix": self.config.isolation.suffix, "groups": sorted(self.isolated_groups)},
            # clients' TLS (--client-tls): the CA they trust
            "client_tls": None if self.client_tls is None else {"ca": str(self.client_tls.ca)},
            # the login clients make themselves, when the cluster wants one the tunnel
            # does not make for them: over what, and with which mechanisms
            "client_login": self.client_login,
            # others served on their own address (containers): where, and what they are told
            "audiences": [
                {"listen": a.listen, "advertise": a.advertise, "bootstrap_servers": told}
                for a, told in zip(
                    self.config.audiences, self.audience_bootstraps().values(), strict=True
                )
            ],
            # where /status and /metrics are served (None: no control socket)
            "control": None if self.control is None else self.control.address,
            "metrics": None if self.control is None else self.control.metrics_address,
            "endpoints": [e.as_dict(tallies[id(e)]) for e in endpoints],
            # the services beside the brokers (--service, --companions) and their forwards
            "companions": [] if self.companions is None else self.companions.status(),
            # brokers the cluster named that get no listener: bad names, or past the limit
            "refused": [r.as_dict() for r in self.registry.refusals.values()],
            "refused_total": self.registry.refused_total,
            "turned_away": self.turned_away,
            # whose clients the tunnel's login serves, and how many others it refused
            "login_users": None if self.login_users is None else self.login_users.status(),
            "recording": None
            if self.recorder is None
            else {
                "directory": str(self.recorder.directory),
                "files": [str(f) for f in self.recorder.files],
                "bytes": self.recorder.written,
                "error": self.recorder.failed,
            },
            "dns": None
            if self.dns is None
            else {
                "listen": join_address(self.dns.host, self.dns.port),
                "names": self.zone.names,
                "domains": self.zone.domains,
                "zones": sorted(self.zone.apexes),
                "answered": self.dns.answered,
                "dropped": self.dns.dropped,
                "bad_packets": self.dns.bad_packets,
            },
        }

    def _tallies(self, endpoints: list[Endpoint]) -> dict[int, Tally]:
        """Per endpoint (by id): what its closed and its open connections did so far."""
        tallies = {id(e): e.closed.copy() for e in endpoints}
        for connection in self.connections:
            tallies.setdefault(id(connection.endpoint), Tally()).add(connection.tally())
        return tallies

    def metrics(self) -> str:
        """Prometheus text: per broker (node="bootstrap" for the bootstrap listener)."""
        endpoints = self.endpoints()
        tallies = self._tallies(endpoints)
        lines = []
        for name, kind, attribute in (
            ("kafkatunnel_connections", "gauge", "connections"),
            ("kafkatunnel_connections_total", "counter", "total_connections"),
            ("kafkatunnel_client_bytes_total", "counter", "bytes_in"),
            ("kafkatunnel_broker_bytes_total", "counter", "bytes_out"),
            ("kafkatunnel_errors_total", "counter", "errors"),
        ):
            lines.append(f"# TYPE {name} {kind}")
            for e in endpoints:
                lines.append(f"{name}{{{_labels(e)}}} {getattr(e, attribute)}")
        lines.append("# TYPE kafkatunnel_requests_total counter")
        lines.extend(
            f"kafkatunnel_requests_total{{{_labels(e)}}} {sum(tallies[id(e)].requests.values())}"
            for e in endpoints
        )
        lines.append("# TYPE kafkatunnel_api_requests_total counter")
        for e in endpoints:
            for api, count in tallies[id(e)].by_api().items():
                lines.append(f'kafkatunnel_api_requests_total{{{_labels(e)},api="{api}"}} {count}')
        lines.append("# TYPE kafkatunnel_api_refused_total counter")
        for e in endpoints:
            for api, count in tallies[id(e)].refused_by_api().items():
                lines.append(f'kafkatunnel_api_refused_total{{{_labels(e)},api="{api}"}} {count}')
        lines.append("# TYPE kafkatunnel_rewrites_total counter")
        lines.extend(
            f"kafkatunnel_rewrites_total{{{_labels(e)}}} {tallies[id(e)].rewrites}"
            for e in endpoints
        )
        lines.append("# TYPE kafkatunnel_spliced_bytes_total counter")
        lines.extend(
            f"kafkatunnel_spliced_bytes_total{{{_labels(e)}}} {tallies[id(e)].spliced}"
            for e in endpoints
        )
        lines.append("# TYPE kafkatunnel_forward_restarts_total counter")
        for e in endpoints:
            restarts = self.forwarder.restarts(e.advertised_host, e.advertised_port)
            lines.append(f"kafkatunnel_forward_restarts_total{{{_labels(e)}}} {restarts}")
        lines.append("# TYPE kafkatunnel_forward_replacements_total counter")
        for e in endpoints:
            replaced = self.forwarder.replacements(e.advertised_host, e.advertised_port)
            lines.append(f"kafkatunnel_forward_replacements_total{{{_labels(e)}}} {replaced}")
        lines.append("# TYPE kafkatunnel_coordinator_errors_total counter")
        for e in endpoints:
            for code in COORDINATOR_ERRORS:
                count = tallies[id(e)].errors.get(code, 0)
                error = COORDINATOR_ERRORS[code]
                lines.append(
                    f'kafkatunnel_coordinator_errors_total{{{_labels(e)},error="{error}"}} {count}'
                )
        lines.extend(self._companion_metrics())
        if self.dns is not None:
            lines.append("# TYPE kafkatunnel_dns_answers_total counter")
            lines.append(f"kafkatunnel_dns_answers_total {self.dns.answered}")
            lines.append("# TYPE kafkatunnel_dns_bad_packets_total counter")
            lines.append(f"kafkatunnel_dns_bad_packets_total {self.dns.bad_packets}")
        return "\n".join(lines) + "\n"


def _service_labels(endpoint: Endpoint) -> str:
    return f'service="{endpoint.advertised}",tunnel="{endpoint.local}"'


def _labels(endpoint: Endpoint) -> str:
    node = "bootstrap" if endpoint.node_id is None else str(endpoint.node_id)
    return f'node="{node}",tunnel="{endpoint.local}"'


def _node(endpoint: Endpoint) -> int:
    return endpoint.node_id if endpoint.node_id is not None else -1


__all__ = [
    "BrokerAddress",
    "PortInUse",
    "Tunnel",
    "TunnelConfig",
    "Unreachable",
]
