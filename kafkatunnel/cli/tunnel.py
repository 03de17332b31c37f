"""`kafkatunnel up` and `kafkatunnel status`: flag checking and the terminal around Tunnel."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.live import Live

from kafkatunnel.capture.recorder import DEFAULT_ROTATE_BYTES
from kafkatunnel.cli.background import detach as run_detached
from kafkatunnel.cli.background import running_or_exit
from kafkatunnel.cli.companions import companion_lines, companions_of
from kafkatunnel.cli.credentials import from_cluster
from kafkatunnel.cli.options import (
    context_option,
    json_option,
    kafka_port_option,
    kubeconfig_option,
    namespace_option,
    port_option,
    selector_option,
    target_option,
)
from kafkatunnel.cli.output import error, make_console, prepare_errors
from kafkatunnel.dns.resolver import METHODS, ResolverError
from kafkatunnel.dns.resolver import setup as resolver_setup
from kafkatunnel.dns.resolver import teardown as resolver_teardown
from kafkatunnel.dns.server import bind_dns
from kafkatunnel.files import private_dir
from kafkatunnel.hostnames import ClusterZones, check_address, check_host
from kafkatunnel.kube.forwarder import KubectlForwarder
from kafkatunnel.kube.kubectl import Kubectl, KubectlError
from kafkatunnel.kube.services import check_namespace
from kafkatunnel.privileges import (
    ResolverChannel,
    drop_to,
    invoking_user,
    split_privileges,
    unreadable_installation,
)
from kafkatunnel.probe import split_address
from kafkatunnel.tunnel import (
    DirectForwarder,
    ExecForwarder,
    Forwarder,
    PortInUse,
    Tunnel,
    TunnelConfig,
    Unreachable,
    parse_mapping,
)
from kafkatunnel.tunnel.companions import Companions
from kafkatunnel.tunnel.containers import ContainerPlan, ContainersError
from kafkatunnel.tunnel.containers import plan as plan_for_containers
from kafkatunnel.tunnel.control import fetch
from kafkatunnel.tunnel.listeners import interface_of
from kafkatunnel.tunnel.registry import DEFAULT_MAX_BROKERS, Endpoint
from kafkatunnel.tunnel.tls import TlsOptions, TlsSetupError, client_context, pkcs12_pem
from kafkatunnel.tunnel.tunnel import DEFAULT_MAX_CONNECTIONS
from kafkatunnel.tunnel.view import status_table

START_TIMEOUT = 15.0


def up(
    bootstrap: str | None = typer.Option(
        None,
        metavar="HOST:PORT",
        help="The advertised HOST:PORT of any broker, as the cluster names it "
        "(with --via kubectl: the first Kafka pod, by default).",
    ),
    via: str | None = typer.Option(
        None,
        metavar="kubectl|exec|direct",
        help="How to reach brokers (default: exec with --exec, direct with --map, else kubectl).",
    ),
    exec_template: str | None = typer.Option(
        None,
        "--exec",
        metavar="COMMAND",
        help='Command opening a stream to {host}:{port}, e.g. "ssh b nc {host} {port}".',
    ),
    mapping: list[str] = typer.Option(
        [],
        "--map",
        metavar="ADVERTISED=REACHABLE",
        help="With --via direct: ADVERTISED_HOST:PORT=REACHABLE_HOST:PORT (repeatable).",
    ),
    listen: str = typer.Option(
        "127.0.0.1:9092",
        metavar="HOST:PORT",
        help="Bootstrap listener; brokers get the following ports.",
    ),
    advertise: str | None = typer.Option(
        None,
        metavar="HOST",
        help="The host clients are told (in answers and bootstrap.servers) instead of the "
        "listen address, e.g. host.docker.internal for containers.",
    ),
    for_containers: bool = typer.Option(
        False,
        "--for-containers",
        help="Also serve containers on this machine: on Linux on the Docker bridge's address "
        "(loopback still served), on Docker Desktop as host.docker.internal.",
    ),
    container_network: str | None = typer.Option(
        None,
        metavar="NAME",
        help="With --for-containers: the Docker network (or bridge interface) they use "
        "(default docker0).",
    ),
    broker_port: list[str] = typer.Option(
        [],
        "--broker-port",
        metavar="NODE_ID=PORT",
        help="Fix a broker's local port (repeatable).",
    ),
    connect_timeout: float = typer.Option(
        10.0, metavar="SECONDS", help="Seconds to open a stream to a broker."
    ),
    start_timeout: float = typer.Option(
        START_TIMEOUT,
        metavar="SECONDS",
        help="At start, wait this long for the bootstrap broker to answer, else exit (0: no wait).",
    ),
    table: bool = typer.Option(True, help="Show the live table (on a terminal)."),
    loop: str = typer.Option(
        "auto",
        metavar="auto|asyncio|uvloop",
        help="Event loop: auto (uvloop if installed), asyncio, uvloop.",
    ),
    mode: str = typer.Option(
        "rewrite",
        metavar="rewrite|transparent",
        help="rewrite: clients see tunnel addresses; transparent: bytes untouched.",
    ),
    dns: bool = typer.Option(False, help="Serve the brokers' names, each on its own loopback."),
    dns_listen: str = typer.Option(
        "127.0.0.1:53", metavar="HOST:PORT", help="Where the DNS shim listens."
    ),
    dns_setup: str = typer.Option(
        "auto",
        metavar="METHOD",
        help="Point the resolver at the shim: auto, hosts, resolver-dir, systemd-resolved, none.",
    ),
    dns_first_address: str = typer.Option(
        "127.0.0.2", metavar="ADDRESS", help="Broker i gets this address + i."
    ),
    dns_zone: list[str] = typer.Option(
        [],
        "--dns-zone",
        metavar="ZONE",
        help="Also resolve brokers' names in this zone (repeatable; the bootstrap's, "
        "--broker's and cluster.local are resolved already).",
    ),
    max_connections: int = typer.Option(
        DEFAULT_MAX_CONNECTIONS,
        metavar="COUNT",
        help="Client connections held at once; past this, new ones are closed at accept.",
    ),
    metrics_listen: str | None = typer.Option(
        None,
        metavar="HOST:PORT",
        help="Also serve Prometheus /metrics over TCP here (status stays owner-only).",
    ),
    max_brokers: int = typer.Option(
        DEFAULT_MAX_BROKERS,
        metavar="COUNT",
        help="Brokers the cluster may name; past this they are refused (each costs listeners "
        "and a forward).",
    ),
    broker: list[str] = typer.Option(
        [],
        "--broker",
        metavar="HOST:PORT",
        help="An advertised HOST:PORT known up front (repeatable).",
    ),
    tls: bool = typer.Option(
        False, "--tls", help="Speak TLS to the brokers, verifying each by its advertised name."
    ),
    tls_ca: Path | None = typer.Option(
        None, metavar="FILE", help="PEM bundle of the CAs to trust (default: the system's)."
    ),
    tls_cert: Path | None = typer.Option(
        None, metavar="FILE", help="Client certificate for mTLS, PEM (may hold its key too)."
    ),
    tls_key: Path | None = typer.Option(
        None, metavar="FILE", help="Private key of --tls-cert, PEM."
    ),
    tls_pkcs12: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="Client certificate and key for mTLS in one PKCS#12 file (e.g. Strimzi's user.p12).",
    ),
    tls_password_file: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="File holding the password of --tls-pkcs12 or an encrypted --tls-key "
        "(or KAFKATUNNEL_TLS_PASSWORD).",
    ),
    tls_insecure: bool = typer.Option(
        False,
        "--tls-insecure",
        help="Verify nothing about the brokers' certificates (broken test clusters only).",
    ),
    client_tls: bool = typer.Option(
        False,
        "--client-tls",
        help="Serve clients TLS too, with a CA the tunnel makes (clients keep "
        "security.protocol=SSL; ssl.ca.location is printed).",
    ),
    kafka_user: str | None = typer.Option(
        None,
        metavar="NAME",
        help="With --via kubectl: a Strimzi KafkaUser whose secret holds the credentials "
        "(tls: the tunnel presents its certificate; scram-sha-512: prints client settings).",
    ),
    show_password: bool = typer.Option(
        False, "--show-password", help="Print a --kafka-user's SCRAM password with its settings."
    ),
    service: list[str] = typer.Option(
        [],
        "--service",
        metavar="NAME[:PORT][=LOCALPORT]",
        help="With --via kubectl: also forward this Kubernetes service (a Schema Registry, "
        "Connect) to a loopback port; with --dns its in-cluster names resolve (repeatable).",
    ),
    companions: bool = typer.Option(
        False,
        "--companions",
        help="With --via kubectl: also forward every Schema Registry, Connect REST API, Kafka "
        "Bridge and Keycloak found in the namespace.",
    ),
    context: str | None = context_option(),
    namespace: str | None = namespace_option(),
    kubeconfig: str | None = kubeconfig_option(),
    target: str | None = target_option(),
    selector: str | None = selector_option(),
    kafka_port: int | None = kafka_port_option(),
    record: str | None = typer.Option(
        None,
        metavar="DIR",
        help="Record the traffic as pcapng files in this directory (see `verify`).",
    ),
    record_rotate: str = typer.Option(
        "64MiB", metavar="SIZE", help="Start a new recording file past this size."
    ),
    record_payloads: bool = typer.Option(
        False, help="Keep Produce/Fetch record data in recordings (cut by default)."
    ),
    zero_copy: bool = typer.Option(
        True, help="Move bytes the tunnel need not read with splice(2) (Linux): less CPU."
    ),
    detach: bool = typer.Option(
        False, "--detach", "-d", help="Run in the background; `kafkatunnel down` stops it."
    ),
) -> None:
    """Open the tunnel and keep it open until Ctrl-C (or, with --detach, until `down`)."""
    console = make_console()
    if detach:
        run_detached(console, sys.argv[1:])
        return
    if bootstrap is not None:
        check_bootstrap(bootstrap)
    if namespace is not None:
        try:
            check_namespace(namespace)
        except ValueError as cause:
            raise typer.BadParameter(str(cause), param_hint="--namespace") from None
    dns_options = DnsOptions(dns, dns_listen, dns_setup, dns_first_address, list(dns_zone),
                             [namespace] if namespace else [])  # fmt: skip
    given = []  # the names the user gave: their zones are the helper's to resolve
    for address in [*([bootstrap] if bootstrap else []), *broker]:
        with contextlib.suppress(ValueError):  # a bad --broker is reported below
            given.append(split_address(address)[0])
    privileges = shed_root(dns_options, given)  # under sudo: from here on, the user
    via = via or default_via(exec_template, mapping)
    kube = KubeOptions(context, namespace, kubeconfig, target, selector, kafka_port)
    forwarder = build_forwarder(via, exec_template, mapping, kube)
    tls_options = parse_tls(
        tls, tls_ca, tls_cert, tls_key, tls_password_file, tls_insecure, tls_pkcs12
    )
    if isinstance(forwarder, KubectlForwarder) and (tls_options or kafka_user):
        tls_options = from_cluster(console, forwarder, tls_options, kafka_user, show_password)
    elif kafka_user:
        raise typer.BadParameter("reads the user's secret with kubectl: add --via kubectl",
                                 param_hint="--kafka-user")  # fmt: skip
    if bootstrap is None and via == "kubectl":
        bootstrap = kube.default_bootstrap(forwarder, tls=tls_options is not None)
    if bootstrap is None:
        raise typer.BadParameter(
            "is required with --via exec and --via direct", param_hint="--bootstrap"
        )
    if start_timeout < 0:
        raise typer.BadParameter("must be 0 or more seconds", param_hint="--start-timeout")
    record_options = RecordOptions.parse(record, record_rotate, record_payloads)
    services = companions_of(forwarder, service, companions, parse_listen(listen)[0])
    run_up(
        console, bootstrap=bootstrap, forwarder=forwarder, listen=listen,
        broker_ports=broker_port, connect_timeout=connect_timeout, table=table, loop=loop,
        mode=mode, dns=dns_options, brokers=broker, record=record_options,
        zero_copy=zero_copy, start_timeout=start_timeout, max_brokers=max_brokers,
        max_connections=max_connections, metrics_listen=metrics_listen, privileges=privileges,
        tls=tls_options, client_tls=client_tls,
        advertise=None if for_containers else advertise,
        containers=container_plan(console, for_containers, container_network, advertise),
        companions=services,
    )  # fmt: skip


def status(as_json: bool = json_option(), port: int | None = port_option()) -> None:
    """Show the running tunnel's brokers, forwards and traffic."""
    run_status(make_console(), as_json, port)


LOOPBACK = ("127.0.0.1", "::1", "localhost")
VIA = ("exec", "direct", "kubectl")


@dataclass
class KubeOptions:
    context: str | None = None
    namespace: str | None = None
    kubeconfig: str | None = None
    target: str | None = None
    selector: str | None = None
    kafka_port: int | None = None

    def default_bootstrap(self, forwarder: Forwarder, tls: bool = False) -> str:
        """The first Kafka pod, found now (so errors show before anything is bound)."""
        assert isinstance(forwarder, KubectlForwarder)
        try:
            asyncio.run(forwarder.prepare())
        except KubectlError as cause:
            error(str(cause))
            raise typer.Exit(2) from None
        return forwarder.default_bootstrap(self.kafka_port, tls=tls)


@dataclass
class Privileges:
    """What root did before the tunnel runs as the user behind sudo."""

    dns_sockets: tuple[socket.socket, socket.socket] | None = None
    resolver: ResolverChannel | None = None  # None: the resolver is set up in-process
    zones: ClusterZones | None = None  # what the root helper lets reach the resolver


def shed_root(dns: DnsOptions, given: list[str]) -> Privileges:
    """Under sudo: bind the DNS shim's port, leave a root helper for the resolver set-up
    when one is asked for, and go on as the invoking user. Otherwise: nothing."""
    user = invoking_user()
    if user is None:
        return Privileges()
    unreadable = unreadable_installation(user)
    if unreadable is not None:
        error(f"under sudo the tunnel runs as {user.name}, but {unreadable}",
              f"install kafkatunnel with a Python {user.name} can read (a virtualenv of the "
              "system's python3, or pipx as that user) and run sudo with it")  # fmt: skip
        raise typer.Exit(2)
    prepare_errors()  # what printing an error imports, imported while root reads everything
    sockets = None
    if dns.enabled:
        try:
            sockets = bind_dns(*parse_listen(dns.listen, "--dns-listen"))
        except OSError as cause:
            error(str(cause))
            raise typer.Exit(2) from None
    if dns.enabled and dns.setup != "none":
        try:
            zones = ClusterZones.of(given, dns.zones, namespaces=dns.namespaces)
        except ValueError as cause:
            raise typer.BadParameter(str(cause), param_hint="--dns-zone") from None
        channel = split_privileges(user, zones, list(sockets or ()))
        return Privileges(sockets, channel, zones)
    drop_to(user)
    return Privileges(sockets)


def default_via(exec_template: str | None, mappings: list[str]) -> str:
    """exec with --exec, direct with --map, otherwise kubectl, when it is installed."""
    if exec_template:
        return "exec"
    if mappings:
        return "direct"
    if shutil.which("kubectl"):
        return "kubectl"
    raise typer.BadParameter(
        "kubectl is not installed, so say how to reach the brokers: --exec COMMAND (ssh, a "
        "pod with socat) or --via direct --map ADVERTISED=REACHABLE",
        param_hint="--via",
    )


def build_forwarder(
    via: str, exec_template: str | None, mappings: list[str], kube: KubeOptions | None = None
) -> Forwarder:
    if via not in VIA:
        raise typer.BadParameter(f"{via!r} is not one of {', '.join(VIA)}", param_hint="--via")
    if via == "kubectl":
        if exec_template or mappings:
            raise typer.BadParameter("--exec and --map do not go with --via kubectl")
        kube = kube or KubeOptions()
        kubectl = Kubectl(
            kubeconfig=kube.kubeconfig, context=kube.context, namespace=kube.namespace
        )
        return KubectlForwarder(kubectl, target=kube.target, selector=kube.selector)
    if via == "exec":
        if not exec_template:
            raise typer.BadParameter(
                'needs a command template, e.g. --exec "ssh bastion nc {host} {port}"',
                param_hint="--via exec",
            )
        if mappings:
            raise typer.BadParameter("--map goes with --via direct, not exec", param_hint="--map")
        try:
            return ExecForwarder(exec_template)
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint="--exec") from None
    if exec_template:
        raise typer.BadParameter("--exec goes with --via exec", param_hint="--exec")
    try:
        return DirectForwarder(parse_mapping(mappings))
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--map") from None


def parse_broker_ports(entries: list[str]) -> dict[int, int]:
    ports = {}
    for entry in entries:
        node, sep, port = entry.partition("=")
        if not sep or not node.strip().lstrip("-").isdigit() or not port.strip().isdigit():
            raise typer.BadParameter(f"{entry!r}: expected NODE_ID=PORT, e.g. 1=19093")
        ports[int(node)] = int(port)
    return ports


def parse_listen(listen: str, flag: str = "--listen") -> tuple[str, int]:
    try:
        host, port = split_address(listen)
    except ValueError:
        raise typer.BadParameter(
            f"{listen!r}: expected HOST:PORT, e.g. 127.0.0.1:9092", param_hint=flag
        ) from None
    if not 0 < port < 65536:
        raise typer.BadParameter(f"port {port} is not between 1 and 65535", param_hint=flag)
    return host, port


@dataclass
class DnsOptions:
    enabled: bool = False
    listen: str = "127.0.0.1:53"
    setup: str = "auto"  # a resolver method, or "none"
    first_address: str = "127.0.0.2"
    zones: list[str] = field(default_factory=list)  # --dns-zone
    namespaces: list[str] = field(default_factory=list)  # --namespace: its short names resolve


SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
              "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3}  # fmt: skip


def parse_size(text: str, flag: str) -> int:
    number = text.strip().rstrip("bBiIkKmMgG")
    unit = text.strip()[len(number) :].lower()
    if not number.isdigit() or unit not in SIZE_UNITS or int(number) == 0:
        raise typer.BadParameter(f"{text!r}: expected a size like 64MiB or 500MB", param_hint=flag)
    return int(number) * SIZE_UNITS[unit]


@dataclass
class RecordOptions:
    directory: Path
    rotate_bytes: int = DEFAULT_ROTATE_BYTES
    payloads: bool = False

    @classmethod
    def parse(cls, directory: str | None, rotate: str, payloads: bool) -> RecordOptions | None:
        rotate_bytes = parse_size(rotate, "--record-rotate")
        if directory is None:
            if payloads:
                raise typer.BadParameter("goes with --record DIR", param_hint="--record-payloads")
            return None
        _check_writable(Path(directory))
        return cls(Path(directory), rotate_bytes, payloads)


PASSWORD_VARIABLE = "KAFKATUNNEL_TLS_PASSWORD"


def parse_tls(
    enabled: bool,
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
    password_file: Path | None,
    insecure: bool,
    pkcs12: Path | None = None,
) -> TlsOptions | None:
    """The TLS options, or None without --tls (a --tls-* option alone is a mistake)."""
    if not enabled:
        given = [flag for flag, value in (("--tls-ca", ca), ("--tls-cert", cert),
                 ("--tls-key", key), ("--tls-password-file", password_file),
                 ("--tls-insecure", insecure), ("--tls-pkcs12", pkcs12)) if value]  # fmt: skip
        if given:
            raise typer.BadParameter(f"{given[0]} goes with --tls", param_hint="--tls")
        return None
    password = None
    if password_file is not None:
        try:
            password = password_file.read_bytes().rstrip(b"\r\n")
        except OSError as cause:
            raise typer.BadParameter(
                f"cannot read {password_file}: {cause.strerror or cause}",
                param_hint="--tls-password-file",
            ) from None
    elif PASSWORD_VARIABLE in os.environ:
        password = os.environ[PASSWORD_VARIABLE].encode()
    if pkcs12 is not None and (cert is not None or key is not None):
        raise typer.BadParameter("give --tls-pkcs12 or --tls-cert/--tls-key, not both",
                                 param_hint="--tls-pkcs12")  # fmt: skip
    options = TlsOptions(ca, cert, key, password, insecure)
    try:
        if pkcs12 is not None:
            cert_pem, key_pem = pkcs12_pem(pkcs12, password)
            options = dataclasses.replace(options, cert_pem=cert_pem, key_pem=key_pem)
        client_context(options)  # every file readable and usable, now rather than later
    except TlsSetupError as cause:
        raise typer.BadParameter(str(cause), param_hint="--tls") from None
    return options


def _check_writable(directory: Path) -> None:
    """Fail now, not at the first connection, when recordings cannot be written there (a
    directory of someone else's is refused: they could read or replace what we record)."""
    try:
        private_dir(directory)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as cause:
        raise typer.BadParameter(
            f"cannot write recordings to {directory}: {cause.strerror or cause}; "
            "choose a directory you may write to",
            param_hint="--record",
        ) from None


def check_bootstrap(bootstrap: str) -> None:
    try:
        check_address(*split_address(bootstrap))
    except ValueError as cause:
        raise typer.BadParameter(
            f"{bootstrap!r}: expected the advertised HOST:PORT of a broker, e.g. "
            f"kafka-0.kafka-headless.shop.svc.cluster.local:9092 ({cause})",
            param_hint="--bootstrap",
        ) from None


def run_up(
    console: Console,
    *,
    bootstrap: str,
    forwarder: Forwarder,
    listen: str,
    broker_ports: list[str],
    connect_timeout: float,
    table: bool,
    loop: str = "auto",
    mode: str = "rewrite",
    dns: DnsOptions | None = None,
    brokers: list[str] | None = None,
    record: RecordOptions | None = None,
    zero_copy: bool = True,
    start_timeout: float | None = START_TIMEOUT,
    max_brokers: int = DEFAULT_MAX_BROKERS,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    metrics_listen: str | None = None,
    privileges: Privileges | None = None,
    tls: TlsOptions | None = None,
    client_tls: bool = False,
    advertise: str | None = None,
    containers: ContainerPlan | None = None,
    companions: Companions | None = None,
) -> None:
    check_bootstrap(bootstrap)
    host, port = parse_listen(listen)
    for warning_text in tls.warnings() if tls else []:
        console.print(f"[yellow]warning: {warning_text}[/]")
    if advertise is not None:
        try:
            check_host(advertise)
        except ValueError as cause:
            raise typer.BadParameter(str(cause), param_hint="--advertise") from None
    audiences = [containers.audience] if containers and containers.audience else []
    advertise = advertise or (containers.advertise if containers else None)
    if audiences and audiences[0].listen == host:  # --listen on the bridge already
        advertise, audiences = advertise or audiences[0].advertise, []
    for listening in [host, *(a.listen for a in audiences)]:
        if listening not in LOOPBACK:
            console.print(f"[yellow]warning: {reach_of_listener(listening)}[/]")
    dns = dns or DnsOptions()
    for entry in brokers or []:
        try:
            check_address(*split_address(entry))
        except ValueError as cause:
            raise typer.BadParameter(
                f"{entry!r}: expected HOST:PORT ({cause})", param_hint="--broker"
            ) from None
    for zone in dns.zones:
        try:
            ClusterZones.of([], [zone])
        except ValueError as cause:
            raise typer.BadParameter(str(cause), param_hint="--dns-zone") from None
    if max_brokers < 1:
        raise typer.BadParameter("must be 1 or more", param_hint="--max-brokers")
    if max_connections < 1:
        raise typer.BadParameter("must be 1 or more", param_hint="--max-connections")
    if dns.setup not in ("none", *METHODS):
        raise typer.BadParameter(
            f"{dns.setup!r} is not one of none, {', '.join(METHODS)}", param_hint="--dns-setup"
        )
    try:
        config = TunnelConfig(
            bootstrap=bootstrap,
            listen_host=host,
            listen_port=port,
            broker_ports=parse_broker_ports(broker_ports),
            connect_timeout=connect_timeout,
            mode=mode,
            dns_listen=parse_listen(dns.listen, "--dns-listen") if dns.enabled else None,
            first_dns_address=dns.first_address,
            brokers=list(brokers or []),
            record_dir=record.directory if record else None,
            record_rotate_bytes=record.rotate_bytes if record else DEFAULT_ROTATE_BYTES,
            record_payloads=record.payloads if record else False,
            zero_copy=zero_copy,
            start_timeout=start_timeout or None,
            max_brokers=max_brokers,
            max_connections=max_connections,
            dns_zones=dns.zones,
            namespaces=dns.namespaces,
            resolver_zones=privileges.zones if privileges else None,
            metrics_listen=parse_listen(metrics_listen, "--metrics-listen")
            if metrics_listen
            else None,
            dns_sockets=privileges.dns_sockets if privileges else None,
            tls=tls,
            client_tls=client_tls,
            advertise=advertise,
            audiences=audiences,
        )
    except ValueError as cause:
        raise typer.BadParameter(str(cause), param_hint="--mode") from None
    run = loop_runner(loop)
    try:
        resolver = privileges.resolver if privileges and privileges.resolver else None
        run(_serve(console, Tunnel(config, forwarder, companions), table, dns, resolver))
    except Unreachable as cause:
        if cause.refused:  # the cause names the missing right and who can grant it
            error(f"cannot reach the bootstrap broker {bootstrap}: {cause}")
        else:
            error(
                f"the bootstrap broker {bootstrap} did not answer within {start_timeout:g}s: "
                f"{cause}",
                _unreachable_fix(forwarder),
            )
        raise typer.Exit(2) from None
    except (PortInUse, OSError, KubectlError) as cause:
        error(str(cause))
        raise typer.Exit(2) from None


def container_plan(
    console: Console, wanted: bool, network: str | None, advertise: str | None
) -> ContainerPlan | None:
    """Where containers reach the tunnel (--for-containers), said in one line; --advertise
    then names the host containers are told (host.docker.internal, say)."""
    if not wanted:
        if network is not None:
            raise typer.BadParameter("goes with --for-containers", param_hint="--container-network")
        return None
    try:
        chosen = plan_for_containers(network)
    except ContainersError as cause:
        raise typer.BadParameter(str(cause), param_hint="--for-containers") from None
    if advertise is not None:
        try:
            check_host(advertise)
        except ValueError as cause:
            raise typer.BadParameter(str(cause), param_hint="--advertise") from None
        if chosen.audience is not None:
            audience = dataclasses.replace(chosen.audience, advertise=advertise)
            chosen = dataclasses.replace(chosen, audience=audience)
        else:
            chosen = dataclasses.replace(chosen, advertise=advertise)
    console.print(chosen.said, highlight=False)
    return chosen


def reach_of_listener(host: str) -> str:
    """Who can reach a listener that is not on loopback, said as plainly as we know it."""
    if host in ("0.0.0.0", "::"):
        return (f"listening on {host}, every address of this machine: other machines and "
                "containers can reach your cluster through this tunnel")  # fmt: skip
    interface = interface_of(host)
    if interface is None:
        return f"listening on {host}, not loopback: whoever can reach {host} can reach your cluster"
    bridge = Path(f"/sys/class/net/{interface}/bridge").exists()
    who = f"the containers on bridge {interface}" if bridge else f"whatever reaches {interface}"
    return (f"listening on {host} ({interface}), not loopback: {who} can reach your cluster "
            "through this tunnel")  # fmt: skip


def _unreachable_fix(forwarder: Forwarder) -> str:
    return {
        "exec": "run the --exec command by hand with a broker's host and port to see it work, "
        "and check --bootstrap",
        "direct": "check --bootstrap and --map (ADVERTISED_HOST:PORT=REACHABLE_HOST:PORT)",
        "kubectl": "check that the broker pods run (`kubectl get pods`) and --bootstrap",
    }.get(forwarder.kind, "check --bootstrap") + "; a slow start: --start-timeout SECONDS"


LOOPS = ("auto", "asyncio", "uvloop")


def loop_runner(loop: str) -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop (libuv: less CPU per byte forwarded) when asked or, with "auto", when it is
    installed; otherwise asyncio's own loop. Checked before any coroutine exists."""
    if loop not in LOOPS:
        raise typer.BadParameter(f"{loop!r} is not one of {', '.join(LOOPS)}", param_hint="--loop")
    if loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if loop == "uvloop":
                raise typer.BadParameter(
                    "uvloop is not installed: pip install uvloop", param_hint="--loop"
                ) from None
        else:
            return uvloop.run
    return asyncio.run


async def _serve(
    console: Console,
    tunnel: Tunnel,
    table: bool,
    dns: DnsOptions,
    helper: ResolverChannel | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM. The resolver is set up here, or by the root `helper`
    when sudo's root was shed (see kafkatunnel.privileges)."""
    setup = helper.setup if helper is not None else resolver_setup
    teardown = helper.teardown if helper is not None else resolver_teardown
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await tunnel.start()
    # What start-up made (kio's thousand schema classes, typer, rich) lives as long as the
    # process: out of the collector's sight, every full collection under load is shorter.
    gc.freeze()
    print(f"bootstrap.servers={tunnel.client_bootstrap}", flush=True)
    for told in tunnel.audience_bootstraps().values():
        print(f"containers: bootstrap.servers={told}", flush=True)
    if tunnel.client_tls is not None:
        print("security.protocol=SSL", flush=True)
        print(f"ssl.ca.location={tunnel.client_tls.ca}", flush=True)
    if tunnel.recorder is not None:
        print(f"recording to {tunnel.recorder.directory}", flush=True)
    for line in companion_lines(tunnel):
        print(line, flush=True)
    configured = False
    try:
        if tunnel.dns is not None and dns.setup != "none":
            status = tunnel.status()["dns"]
            try:
                plan = setup(
                    method=dns.setup,
                    names=status["names"],
                    domains=status["zones"],
                    server=parse_listen(status["listen"]),
                )
            except (ResolverError, OSError) as cause:
                error(f"cannot point the resolver at the DNS shim: {cause}")
                raise typer.Exit(2) from None
            configured = True
            for note in plan.notes:
                print(f"resolver: note: {note}", file=sys.stderr, flush=True)
            print(f"resolver: {plan.method}: " + "; ".join(plan.steps), flush=True)
        if table and console.is_terminal:
            with Live(status_table(tunnel.status()), console=console, refresh_per_second=4) as live:
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 0.5)
                    live.update(status_table(tunnel.status()))
        else:
            for endpoint in tunnel.endpoints():
                print(endpoint_line(endpoint, tunnel.transparent), flush=True)
            await stop.wait()
    finally:
        if configured:
            for step in teardown():
                print(f"resolver: {step}", file=sys.stderr, flush=True)
        await tunnel.stop()
        print("tunnel closed", file=sys.stderr, flush=True)


def endpoint_line(endpoint: Endpoint, transparent: bool) -> str:
    """`broker 1: 127.0.0.1:9093 -> kafka-0...:9092`, and with the DNS shim in rewrite mode
    where the broker's name leads (clients given a name reach the broker there too)."""
    node = "bootstrap" if endpoint.node_id is None else f"broker {endpoint.node_id}"
    line = f"{node}: {endpoint.local} -> {endpoint.advertised}"
    if endpoint.note is not None:
        line += f" ({endpoint.note})"
    elif endpoint.dns_address is not None and not transparent:
        line += f" (name: {endpoint.dns_address}:{endpoint.advertised_port})"
    return line


def run_status(console: Console, as_json: bool, port: int | None) -> None:
    tunnels = running_or_exit(console, port)
    states = [json.loads(fetch(state["control"], "/status")) for state in tunnels.values()]
    if as_json:
        typer.echo(json.dumps(states[0] if len(states) == 1 else states, indent=2))
        return
    for state in states:
        console.print(status_table(state, cut=console.is_terminal))
