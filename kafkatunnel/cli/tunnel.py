"""`kafkatunnel up` and `kafkatunnel status`: from the flags (up_options.py) to a running Tunnel,
and the terminal around it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import signal
import socket
import ssl
import sys
import tempfile
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape

from kafkatunnel.cli.background import detach as run_detached
from kafkatunnel.cli.background import running_or_exit
from kafkatunnel.cli.companions import companion_lines, companions_of
from kafkatunnel.cli.credentials import from_cluster, sasl_login
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
from kafkatunnel.cli.up_options import (
    DNS,
    GUARD,
    KUBE,
    LIMITS,
    LOGIN,
    REACH,
    RECORDING,
    RUNNING,
    SERVING,
    TLS,
    Checked,
    DnsOptions,
    Guard,
    KubeOptions,
    Limits,
    Reach,
    RecordFlags,
    Running,
    SaslFlags,
    Serving,
    TlsFlags,
    UpOptions,
    check,
    parse_listen,
)
from kafkatunnel.dns.resolver import ResolverError
from kafkatunnel.dns.resolver import setup as resolver_setup
from kafkatunnel.dns.resolver import teardown as resolver_teardown
from kafkatunnel.dns.server import bind_dns
from kafkatunnel.files import private_dir
from kafkatunnel.hostnames import ClusterZones, derived_zone
from kafkatunnel.kube.forwarder import KubectlForwarder
from kafkatunnel.kube.kubectl import Kubectl, KubectlError
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
    SettingError,
    Tunnel,
    TunnelConfig,
    Unreachable,
)
from kafkatunnel.tunnel.containers import ContainerPlan, ContainersError
from kafkatunnel.tunnel.containers import plan as plan_for_containers
from kafkatunnel.tunnel.control import fetch
from kafkatunnel.tunnel.listeners import interface_of
from kafkatunnel.tunnel.oauth_token import REQUEST_TIMEOUT, TokenError, TokenSource
from kafkatunnel.tunnel.registry import DEFAULT_MAX_BROKERS, Endpoint
from kafkatunnel.tunnel.tls import (
    TlsOptions,
    TlsSetupError,
    client_context,
    listener_tls,
    pkcs12_pem,
)
from kafkatunnel.tunnel.tunnel import DEFAULT_MAX_CONNECTIONS
from kafkatunnel.tunnel.view import status_table

START_TIMEOUT = 15.0


def up(
    bootstrap: str | None = typer.Option(
        None,
        metavar="HOST:PORT",
        help="The advertised HOST:PORT of any broker, as the cluster names it "
        "(with --via kubectl: the first Kafka pod, by default).",
        rich_help_panel=REACH,
    ),
    via: str | None = typer.Option(
        None,
        metavar="kubectl|exec|direct",
        help="How to reach brokers (default: exec with --exec, direct with --map, else kubectl).",
        rich_help_panel=REACH,
    ),
    exec_template: str | None = typer.Option(
        None,
        "--exec",
        metavar="COMMAND",
        help='Command opening a stream to {host}:{port}, e.g. "ssh b nc {host} {port}".',
        rich_help_panel=REACH,
    ),
    mapping: list[str] = typer.Option(
        [],
        "--map",
        metavar="ADVERTISED=REACHABLE",
        help="With --via direct: ADVERTISED_HOST:PORT=REACHABLE_HOST:PORT (repeatable).",
        rich_help_panel=REACH,
    ),
    listen: str = typer.Option(
        "127.0.0.1:9092",
        metavar="HOST:PORT",
        help="Bootstrap listener; brokers get the following ports.",
        rich_help_panel=SERVING,
    ),
    advertise: str | None = typer.Option(
        None,
        metavar="HOST",
        help="The host clients are told (in answers and bootstrap.servers) instead of the "
        "listen address, e.g. host.docker.internal for containers.",
        rich_help_panel=SERVING,
    ),
    for_containers: bool = typer.Option(
        False,
        "--for-containers",
        help="Also serve containers on this machine: on Linux on the Docker bridge's address "
        "(loopback still served), on Docker Desktop as host.docker.internal.",
        rich_help_panel=SERVING,
    ),
    container_network: str | None = typer.Option(
        None,
        metavar="NAME",
        help="With --for-containers: the Docker network (or bridge interface) they use "
        "(default docker0).",
        rich_help_panel=SERVING,
    ),
    broker_port: list[str] = typer.Option(
        [],
        "--broker-port",
        metavar="NODE_ID=PORT",
        help="Fix a broker's local port (repeatable).",
        rich_help_panel=SERVING,
    ),
    connect_timeout: float = typer.Option(
        10.0,
        metavar="SECONDS",
        help="Seconds to open a stream to a broker: its TLS handshake and login included.",
        rich_help_panel=LIMITS,
    ),
    start_timeout: float = typer.Option(
        START_TIMEOUT,
        metavar="SECONDS",
        help="At start, wait this long for the bootstrap broker (and an OAUTHBEARER token) "
        "to answer, else exit (0: no wait for the broker).",
        rich_help_panel=LIMITS,
    ),
    table: bool = typer.Option(
        True, help="Show the live table (on a terminal).", rich_help_panel=RUNNING
    ),
    loop: str = typer.Option(
        "auto",
        metavar="auto|asyncio|uvloop",
        help="Event loop: auto (uvloop if installed), asyncio, uvloop.",
        rich_help_panel=RUNNING,
    ),
    mode: str = typer.Option(
        "rewrite",
        metavar="rewrite|transparent",
        help="rewrite: clients see tunnel addresses; transparent: bytes untouched.",
        rich_help_panel=RUNNING,
    ),
    dns: bool = typer.Option(
        False, help="Serve the brokers' names, each on its own loopback.", rich_help_panel=DNS
    ),
    dns_listen: str = typer.Option(
        "127.0.0.1:53",
        metavar="HOST:PORT",
        help="Where the DNS shim listens.",
        rich_help_panel=DNS,
    ),
    dns_setup: str = typer.Option(
        "auto",
        metavar="METHOD",
        help="Point the resolver at the shim: auto, hosts, resolver-dir, systemd-resolved, none.",
        rich_help_panel=DNS,
    ),
    dns_first_address: str = typer.Option(
        "127.0.0.2",
        metavar="ADDRESS",
        help="Broker i gets this address + i.",
        rich_help_panel=DNS,
    ),
    dns_zone: list[str] = typer.Option(
        [],
        "--dns-zone",
        metavar="ZONE",
        help="Also resolve brokers' names in this zone (repeatable; the bootstrap's, "
        "--broker's and cluster.local are resolved already).",
        rich_help_panel=DNS,
    ),
    max_connections: int = typer.Option(
        DEFAULT_MAX_CONNECTIONS,
        metavar="COUNT",
        help="Client connections held at once; past this, new ones are closed at accept.",
        rich_help_panel=LIMITS,
    ),
    metrics_listen: str | None = typer.Option(
        None,
        metavar="HOST:PORT",
        help="Also serve Prometheus /metrics over TCP here (status stays owner-only).",
        rich_help_panel=SERVING,
    ),
    max_brokers: int = typer.Option(
        DEFAULT_MAX_BROKERS,
        metavar="COUNT",
        help="Brokers the cluster may name; past this they are refused (each costs listeners "
        "and a forward).",
        rich_help_panel=LIMITS,
    ),
    broker: list[str] = typer.Option(
        [],
        "--broker",
        metavar="HOST:PORT",
        help="An advertised HOST:PORT known up front (repeatable).",
        rich_help_panel=REACH,
    ),
    tls: bool = typer.Option(
        False,
        "--tls",
        help="Speak TLS to the brokers, verifying each by its advertised name.",
        rich_help_panel=TLS,
    ),
    tls_ca: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="PEM bundle of the CAs to trust (default: the system's).",
        rich_help_panel=TLS,
    ),
    tls_cert: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="Client certificate for mTLS, PEM (may hold its key too).",
        rich_help_panel=TLS,
    ),
    tls_key: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="Private key of --tls-cert, PEM.",
        rich_help_panel=TLS,
    ),
    tls_pkcs12: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="Client certificate and key for mTLS in one PKCS#12 file (e.g. Strimzi's user.p12).",
        rich_help_panel=TLS,
    ),
    tls_password_file: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="File holding the password of --tls-pkcs12 or an encrypted --tls-key "
        "(or KAFKATUNNEL_TLS_PASSWORD).",
        rich_help_panel=TLS,
    ),
    tls_insecure: bool = typer.Option(
        False,
        "--tls-insecure",
        help="Verify nothing about the brokers' certificates (broken test clusters only).",
        rich_help_panel=TLS,
    ),
    client_tls: bool = typer.Option(
        False,
        "--client-tls",
        help="Serve clients TLS too, with a CA the tunnel makes (clients keep "
        "security.protocol=SSL; ssl.ca.location is printed).",
        rich_help_panel=TLS,
    ),
    kafka_user: str | None = typer.Option(
        None,
        metavar="NAME",
        help="With --via kubectl: a Strimzi KafkaUser whose secret holds the credentials "
        "(tls: the tunnel presents its certificate; scram-sha-512: the tunnel logs in).",
        rich_help_panel=TLS,
    ),
    show_password: bool = typer.Option(
        False,
        "--show-password",
        help="For a SCRAM --kafka-user: print its client settings with the password, and "
        "let clients log in themselves.",
        rich_help_panel=TLS,
    ),
    sasl_mechanism: str | None = typer.Option(
        None,
        metavar="MECHANISM",
        help="Log in to the brokers for the clients: SCRAM-SHA-256, SCRAM-SHA-512, PLAIN or "
        "OAUTHBEARER (clients then need no credentials).",
        rich_help_panel=LOGIN,
    ),
    sasl_username: str | None = typer.Option(
        None, metavar="NAME", help="The user --sasl-mechanism logs in as.", rich_help_panel=LOGIN
    ),
    sasl_password_file: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="File holding --sasl-username's password.",
        rich_help_panel=LOGIN,
    ),
    sasl_password_env: str | None = typer.Option(
        None,
        metavar="VARIABLE",
        help="Environment variable holding --sasl-username's password.",
        rich_help_panel=LOGIN,
    ),
    sasl_token_endpoint: str | None = typer.Option(
        None,
        metavar="URL",
        help="OAUTHBEARER: the identity provider's token endpoint; the tunnel asks it for "
        "tokens with the client credentials grant.",
        rich_help_panel=LOGIN,
    ),
    sasl_client_id: str | None = typer.Option(
        None, metavar="ID", help="OAUTHBEARER: the client id.", rich_help_panel=LOGIN
    ),
    sasl_client_secret_file: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="OAUTHBEARER: file holding --sasl-client-id's secret.",
        rich_help_panel=LOGIN,
    ),
    sasl_client_secret_env: str | None = typer.Option(
        None,
        metavar="VARIABLE",
        help="OAUTHBEARER: environment variable holding --sasl-client-id's secret.",
        rich_help_panel=LOGIN,
    ),
    sasl_scope: str | None = typer.Option(
        None, metavar="SCOPE", help="OAUTHBEARER: the scope to ask for.", rich_help_panel=LOGIN
    ),
    sasl_token_endpoint_ca: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="OAUTHBEARER: the CA (PEM) of an https token endpoint (default: the system's).",
        rich_help_panel=LOGIN,
    ),
    service: list[str] = typer.Option(
        [],
        "--service",
        metavar="NAME[:PORT][=LOCALPORT]",
        help="With --via kubectl: also forward this Kubernetes service (a Schema Registry, "
        "Connect) to a loopback port; with --dns its in-cluster names resolve (repeatable).",
        rich_help_panel=SERVING,
    ),
    companions: bool = typer.Option(
        False,
        "--companions",
        help="With --via kubectl: also forward every Schema Registry, Connect REST API, Kafka "
        "Bridge and Keycloak found in the namespace.",
        rich_help_panel=SERVING,
    ),
    context: str | None = context_option(KUBE),
    namespace: str | None = namespace_option(KUBE),
    kubeconfig: str | None = kubeconfig_option(KUBE),
    target: str | None = target_option(KUBE),
    selector: str | None = selector_option(KUBE),
    kafka_port: int | None = kafka_port_option(KUBE),
    record: str | None = typer.Option(
        None,
        metavar="DIR",
        help="Record the traffic as pcapng files in this directory (see `verify`).",
        rich_help_panel=RECORDING,
    ),
    record_rotate: str = typer.Option(
        "64MiB",
        metavar="SIZE",
        help="Start a new recording file past this size.",
        rich_help_panel=RECORDING,
    ),
    record_payloads: bool = typer.Option(
        False,
        help="Keep Produce/Fetch record data in recordings (cut by default).",
        rich_help_panel=RECORDING,
    ),
    zero_copy: bool = typer.Option(
        True,
        help="Move bytes the tunnel need not read with splice(2) (Linux): less CPU.",
        rich_help_panel=RUNNING,
    ),
    read_only: bool = typer.Option(
        False,
        "--read-only",
        help="Refuse every request that changes the cluster (produce, topics, configs, "
        "offsets of others' groups, ACLs, transactions...): clients get Kafka's own "
        "authorization error.",
        rich_help_panel=GUARD,
    ),
    deny_api: list[str] = typer.Option(
        [],
        "--deny-api",
        metavar="NAME",
        help="Also refuse this Kafka API, e.g. DeleteTopics (repeatable).",
        rich_help_panel=GUARD,
    ),
    allow_api: list[str] = typer.Option(
        [],
        "--allow-api",
        metavar="NAME",
        help="Let this Kafka API pass although --read-only refuses it, e.g. Produce (repeatable).",
        rich_help_panel=GUARD,
    ),
    detach: bool = typer.Option(
        False,
        "--detach",
        "-d",
        help="Run in the background; `kafkatunnel down` stops it.",
        rich_help_panel=RUNNING,
    ),
) -> None:
    """Open the tunnel and keep it open until Ctrl-C (or, with --detach, until `down`)."""
    console = make_console()
    if detach:
        run_detached(console, sys.argv[1:])
        return
    options = UpOptions(
        reach=Reach(bootstrap, via, exec_template, tuple(mapping), tuple(broker)),
        kube=KubeOptions(context, namespace, kubeconfig, target, selector, kafka_port),
        serving=Serving(listen, advertise, for_containers, container_network,
                        tuple(broker_port), metrics_listen, tuple(service), companions),
        dns=DnsOptions(dns, dns_listen, dns_setup, dns_first_address, tuple(dns_zone),
                       (namespace,) if namespace else ()),
        tls=TlsFlags(tls, tls_ca, tls_cert, tls_key, tls_pkcs12, tls_password_file,
                     tls_insecure, client_tls, kafka_user, show_password),
        sasl=SaslFlags(sasl_mechanism, sasl_username, sasl_password_file, sasl_password_env,
                       sasl_token_endpoint, sasl_client_id, sasl_client_secret_file,
                       sasl_client_secret_env, sasl_scope, sasl_token_endpoint_ca),
        record=RecordFlags(None if record is None else Path(record), record_rotate,
                           record_payloads),
        limits=Limits(connect_timeout, start_timeout, max_connections, max_brokers),
        running=Running(table, loop, mode, zero_copy),
        guard=Guard(read_only, tuple(deny_api), tuple(allow_api)),
    )  # fmt: skip
    run_up(console, options)


def status(as_json: bool = json_option(), port: int | None = port_option()) -> None:
    """Show the running tunnel's brokers, forwards and traffic."""
    run_status(make_console(), as_json, port)


LOOPBACK = ("127.0.0.1", "::1", "localhost")
PASSWORD_VARIABLE = "KAFKATUNNEL_TLS_PASSWORD"


def run_up(console: Console, options: UpOptions) -> None:
    """`up` with its flags: checked first (check()), then, as the user behind any sudo,
    the forwarder, the TLS context (built once), and the tunnel."""
    checked = check(options)
    reach, tls_flags = options.reach, options.tls
    given = []  # the names the user gave: their zones are the helper's to resolve
    for address in [*([reach.bootstrap] if reach.bootstrap else []), *reach.brokers]:
        with contextlib.suppress(ValueError):  # a bad one is reported by TunnelConfig
            host = split_address(address)[0]
            derived_zone(host)
            given.append(host)
    privileges = shed_root(options.dns, given)  # under sudo: from here on, the user
    forwarder = build_forwarder(checked, options)
    tls = read_tls(tls_flags)
    login = sasl_login(options.sasl)
    if isinstance(forwarder, KubectlForwarder) and (tls or tls_flags.kafka_user):
        tls, user_login = from_cluster(console, forwarder, tls, tls_flags.kafka_user,
                                       tls_flags.show_password)  # fmt: skip
        login = login or user_login
    if login is not None and options.sasl.mechanism is not None:
        tokens = "" if login.tokens is None else f" (tokens from {login.tokens.endpoint.url})"
        console.print(f"SASL: the tunnel logs in as {escape(login.username)} with "
                      f"{login.mechanism}{escape(tokens)}; clients need no credentials of "
                      "their own", highlight=False)  # fmt: skip
    context = None if tls is None else tls_context(tls)  # once, before any pod is looked up
    bootstrap = reach.bootstrap or default_bootstrap(forwarder, options.kube, tls is not None)
    for warning_text in tls.warnings() if tls else []:
        console.print(f"[yellow]warning: {warning_text}[/]")
    serving = options.serving
    companions = companions_of(forwarder, checked.services, serving.companions, checked.listen[0])
    containers = container_plan(console, serving)
    host, port = checked.listen
    audiences = [containers.audience] if containers and containers.audience else []
    advertise = None if serving.for_containers else serving.advertise
    advertise = advertise or (containers.advertise if containers else None)
    if audiences and audiences[0].listen == host:  # --listen on the bridge already
        advertise, audiences = advertise or audiences[0].advertise, []
    for listening in [host, *(a.listen for a in audiences)]:
        if listening not in LOOPBACK:
            console.print(f"[yellow]warning: {reach_of_listener(listening)}[/]")
    record, limits, dns = options.record, options.limits, options.dns
    if record.directory is not None:
        _check_writable(record.directory)
    try:
        config = TunnelConfig(
            bootstrap=bootstrap,
            listen_host=host,
            listen_port=port,
            broker_ports=checked.broker_ports,
            connect_timeout=limits.connect_timeout,
            mode=options.running.mode,
            dns_listen=checked.dns_listen,
            first_dns_address=dns.first_address,
            brokers=list(reach.brokers),
            record_dir=record.directory,
            record_rotate_bytes=checked.rotate_bytes,
            record_payloads=record.payloads,
            zero_copy=options.running.zero_copy,
            start_timeout=limits.start_timeout or None,
            max_brokers=limits.max_brokers,
            max_connections=limits.max_connections,
            dns_zones=list(dns.zones),
            namespaces=list(dns.namespaces),
            resolver_zones=privileges.zones,
            metrics_listen=checked.metrics_listen,
            dns_sockets=privileges.dns_sockets,
            tls=context,
            tls_certificate=None if tls is None else tls.certificate_named,
            login=login,
            advertise=advertise,
            audiences=audiences,
            policy=checked.policy,
        )
        if tls_flags.client:
            client = listener_tls(config.listen_host, told=config.told_hosts)
            config = dataclasses.replace(config, client_tls=client)
    except SettingError as cause:
        raise typer.BadParameter(str(cause), param_hint=cause.flag) from None
    if login is not None and login.tokens is not None:  # once every setting is known good
        _first_token(login.tokens, limits.start_timeout)
    run = loop_runner(options.running.loop)
    try:
        run(_serve(console, Tunnel(config, forwarder, companions), options.running.table, dns,
                   privileges.resolver))  # fmt: skip
    except Unreachable as cause:
        if cause.login:  # the cause names the broker, the mechanism, the user and the fix
            error(f"the tunnel cannot log in: {cause}")
        elif cause.refused:  # the cause names the missing right and who can grant it
            error(f"cannot reach the bootstrap broker {bootstrap}: {cause}")
        else:
            error(
                f"the bootstrap broker {bootstrap} did not answer within "
                f"{limits.start_timeout:g}s: {cause}",
                _unreachable_fix(forwarder),
            )
        raise typer.Exit(2) from None
    except (PortInUse, OSError, KubectlError) as cause:
        error(str(cause))
        raise typer.Exit(2) from None


def _first_token(tokens: TokenSource, start_timeout: float) -> None:
    """OAUTHBEARER: the first token, before the tunnel starts, so that an endpoint that
    cannot be reached or refuses the client stops `up` at once with its own cause (not a
    bootstrap broker that seems not to answer), and one that does not answer stops it
    after --start-timeout (REQUEST_TIMEOUT with 0, which waits for no broker)."""
    within = start_timeout if start_timeout > 0 else REQUEST_TIMEOUT
    try:
        tokens.fetch_first(within)
    except TokenError as cause:  # it names the endpoint, the client, the cause and the fix
        error(f"the tunnel cannot log in: {cause}")
        raise typer.Exit(2) from None


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


def build_forwarder(checked: Checked, options: UpOptions) -> Forwarder:
    """The forwarder the flags name (they are checked: see up_options.check)."""
    if checked.via == "kubectl":
        kube = options.kube
        kubectl = Kubectl(
            kubeconfig=kube.kubeconfig, context=kube.context, namespace=kube.namespace
        )
        return KubectlForwarder(kubectl, target=kube.target, selector=kube.selector)
    if checked.via == "exec":
        assert options.reach.exec_template is not None
        return ExecForwarder(options.reach.exec_template)
    return DirectForwarder(checked.mappings)


def default_bootstrap(forwarder: Forwarder, kube: KubeOptions, tls: bool) -> str:
    """The first Kafka pod, found now (so errors show before anything is bound)."""
    assert isinstance(forwarder, KubectlForwarder)
    try:
        asyncio.run(forwarder.prepare())
    except KubectlError as cause:
        error(str(cause))
        raise typer.Exit(2) from None
    return forwarder.default_bootstrap(kube.kafka_port, tls=tls)


def read_tls(flags: TlsFlags) -> TlsOptions | None:
    """The TLS options, their files read (as the user), or None without --tls."""
    if not flags.enabled:
        return None
    password = None
    if flags.password_file is not None:
        try:
            password = flags.password_file.read_bytes().rstrip(b"\r\n")
        except OSError as cause:
            raise typer.BadParameter(
                f"cannot read {flags.password_file}: {cause.strerror or cause}",
                param_hint="--tls-password-file",
            ) from None
    elif PASSWORD_VARIABLE in os.environ:
        password = os.environ[PASSWORD_VARIABLE].encode()
    options = TlsOptions(flags.ca, flags.cert, flags.key, password, flags.insecure)
    if flags.pkcs12 is not None:
        try:
            cert_pem, key_pem = pkcs12_pem(flags.pkcs12, password)
        except TlsSetupError as cause:
            raise typer.BadParameter(str(cause), param_hint="--tls-pkcs12") from None
        options = dataclasses.replace(options, cert_pem=cert_pem, key_pem=key_pem,
                                      cert_pem_from=f"--tls-pkcs12 {flags.pkcs12}")  # fmt: skip
    return options


def tls_context(options: TlsOptions) -> ssl.SSLContext:
    """The one SSLContext for every broker connection (its error names the flag at fault)."""
    try:
        return client_context(options)
    except TlsSetupError as cause:
        raise typer.BadParameter(str(cause), param_hint="--tls") from None


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


def container_plan(console: Console, serving: Serving) -> ContainerPlan | None:
    """Where containers reach the tunnel (--for-containers), said in one line; --advertise
    then names the host containers are told (host.docker.internal, say)."""
    if not serving.for_containers:
        return None
    try:
        chosen = plan_for_containers(serving.container_network)
    except ContainersError as cause:
        raise typer.BadParameter(str(cause), param_hint="--for-containers") from None
    if serving.advertise is not None:  # checked by TunnelConfig, as every host told
        if chosen.audience is not None:
            audience = dataclasses.replace(chosen.audience, advertise=serving.advertise)
            chosen = dataclasses.replace(chosen, audience=audience)
        else:
            chosen = dataclasses.replace(chosen, advertise=serving.advertise)
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


def loop_runner(loop: str) -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop (libuv: less CPU per byte forwarded) when asked or, with "auto", when it is
    installed; otherwise asyncio's own loop. Checked before any coroutine exists."""
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
