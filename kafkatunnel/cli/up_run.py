"""What `kafkatunnel up` runs once its flags are checked (up_options.check): from them to a
running Tunnel, and the terminal around it. `up` imports this module when it runs: it
loads the tunnel, the protocol, kio and the TLS stack, which nothing else of the command
line needs."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import ipaddress
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

from kafkatunnel.cli.companions import companion_lines, companions_of
from kafkatunnel.cli.credentials import from_cluster, sasl_login
from kafkatunnel.cli.output import error, prepare_errors
from kafkatunnel.cli.up_options import (
    Checked,
    DnsOptions,
    KubeOptions,
    Serving,
    TlsFlags,
    UpOptions,
    parse_listen,
)
from kafkatunnel.dns.resolver import ResolverError
from kafkatunnel.dns.resolver import setup as resolver_setup
from kafkatunnel.dns.resolver import teardown as resolver_teardown
from kafkatunnel.dns.server import bind_dns
from kafkatunnel.files import private_dir
from kafkatunnel.hostnames import ClusterZones, derived_zone, split_address
from kafkatunnel.kube.forwarder import KubectlForwarder
from kafkatunnel.kube.kubectl import Kubectl, KubectlError
from kafkatunnel.privileges import (
    ResolverChannel,
    drop_to,
    invoking_user,
    split_privileges,
    unreadable_installation,
)
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
from kafkatunnel.tunnel.listeners import interface_of
from kafkatunnel.tunnel.oauth_token import REQUEST_TIMEOUT, TokenError, TokenSource
from kafkatunnel.tunnel.registry import Endpoint
from kafkatunnel.tunnel.tls import (
    TlsOptions,
    TlsSetupError,
    client_context,
    listener_tls,
    pkcs12_pem,
)
from kafkatunnel.tunnel.view import status_table

LOOPBACK = ("127.0.0.1", "::1", "localhost")
PASSWORD_VARIABLE = "KAFKATUNNEL_TLS_PASSWORD"


def run_up(console: Console, options: UpOptions, checked: Checked) -> None:
    """`up` with its flags, checked (up_options.check): as the user behind any sudo, the
    forwarder, the TLS context (built once), and the tunnel."""
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
    context = None if tls is None else tls_context(tls)  # once, before any pod is looked up
    bootstrap = reach.bootstrap or default_bootstrap(forwarder, options.kube, tls is not None)
    for warning_text in tls.warnings() if tls else []:
        console.print(f"[yellow]warning: {warning_text}[/]")
    for warning_text in options.sasl.warnings():  # a URL may hold brackets: [::1]
        console.print(f"[yellow]warning: {escape(warning_text)}[/]", highlight=False)
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
            isolation=checked.isolation,
            target=options.target(),
        )
        if tls_flags.client:
            client = listener_tls(config.listen_host, told=config.told_hosts)
            config = dataclasses.replace(config, client_tls=client)
    except SettingError as cause:
        raise typer.BadParameter(str(cause), param_hint=cause.flag) from None
    if login is not None and options.sasl.mechanism is not None:  # every setting known good
        tokens = "" if login.tokens is None else f" (tokens from {login.tokens.endpoint.url})"
        console.print(f"SASL: the tunnel logs in as {escape(login.username)} with "
                      f"{login.mechanism}{escape(tokens)}; clients need no credentials of "
                      "their own", highlight=False)  # fmt: skip
    if login is not None and login.tokens is not None:
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


def on_loopback(host: str) -> bool:
    """Whether only this machine's programs can reach a listener on `host`."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


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
    if tunnel.config.isolation is not None:
        suffix = tunnel.config.isolation.suffix
        said = (f"isolate: clients' group and transactional ids are ID.{suffix} on the "
                "cluster (their own; `kafkatunnel down --clean` deletes the groups)")  # fmt: skip
        print(said, flush=True)
    for line in companion_lines(tunnel):
        print(line, flush=True)
    if tunnel.login_users is not None:
        print(f"login: {tunnel.login_users.said}", flush=True)
        for host in dict.fromkeys(tunnel.listen_hosts):
            if not on_loopback(host):
                console.print(f"[yellow]warning: {escape(tunnel.login_users.elsewhere(host))}[/]",
                              highlight=False)  # fmt: skip
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
