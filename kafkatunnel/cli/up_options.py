"""`kafkatunnel up`'s flags as a few groups, and the one check of what the flags say on
their own: each error names the flag at fault (typer.BadParameter's param_hint).

What needs more than the flags is checked where it is known, still naming its flag: files
(TLS material, the recording directory) are read once root is shed, so as the user; the
tunnel's own settings (addresses, limits, modes that go together) by TunnelConfig
(SettingError). Nothing is checked twice.

Checking loads little: the modules behind a check (the forwarders' templates, the
resolver's methods, the protocol's API names) are imported by the check that needs them,
so that a mistyped flag is said as quickly as --help is shown."""

from __future__ import annotations

import getpass
import ipaddress
import re
import shutil
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import typer

from kafkatunnel.hostnames import parse_port, split_address
from kafkatunnel.kube.services import ServiceRequest, check_namespace

if TYPE_CHECKING:
    from kafkatunnel.protocol import Isolation, Policy

T = TypeVar("T")
R = TypeVar("R")
VIA = ("exec", "direct", "kubectl")
LOOPS = ("auto", "asyncio", "uvloop")
MAX_NODE_ID = 2**31 - 1  # Kafka's node ids are int32, and not negative
WILDCARDS = {"0.0.0.0", "::"}  # a listener there takes its port on every address
SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
              "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3}  # fmt: skip
# up --help's panels, one per group
REACH, KUBE, SERVING, DNS, TLS = (
    "Reaching the brokers",
    "Kubernetes",
    "Serving clients",
    "DNS",
    "TLS",
)
RECORDING, LIMITS, RUNNING = "Recording", "Limits", "Running"
GUARD = "Guarding a shared cluster"
LOGIN = "Logging in (SASL)"
SASL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "OAUTHBEARER")


@dataclass(frozen=True)
class Reach:
    """How the brokers are reached."""

    bootstrap: str | None = None
    via: str | None = None  # None: exec with --exec, direct with --map, else kubectl
    exec_template: str | None = None
    mappings: tuple[str, ...] = ()
    brokers: tuple[str, ...] = ()  # advertised HOST:PORT known up front


@dataclass(frozen=True)
class KubeOptions:
    """Where the cluster is, for --via kubectl (and doctor)."""

    context: str | None = None
    namespace: str | None = None
    kubeconfig: str | None = None
    target: str | None = None
    selector: str | None = None
    kafka_port: int | None = None


@dataclass(frozen=True)
class Serving:
    """Where clients reach the tunnel."""

    listen: str = "127.0.0.1:9092"
    advertise: str | None = None
    for_containers: bool = False
    container_network: str | None = None
    broker_ports: tuple[str, ...] = ()  # NODE_ID=PORT
    metrics_listen: str | None = None
    services: tuple[str, ...] = ()  # --service NAME[:PORT][=LOCALPORT]
    companions: bool = False  # --companions: every known service found in the namespace


@dataclass(frozen=True)
class DnsOptions:
    enabled: bool = False
    listen: str = "127.0.0.1:53"
    setup: str = "auto"  # a resolver method, or "none"
    first_address: str = "127.0.0.2"
    zones: tuple[str, ...] = ()  # --dns-zone
    namespaces: tuple[str, ...] = ()  # --namespace: its short names resolve


@dataclass(frozen=True)
class TlsFlags:
    """TLS to the brokers and to the clients, and a Strimzi user's credentials."""

    enabled: bool = False  # --tls
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    pkcs12: Path | None = None
    password_file: Path | None = None
    insecure: bool = False
    client: bool = False  # --client-tls
    kafka_user: str | None = None
    show_password: bool = False

    def given_without_tls(self) -> list[str]:
        return [flag for flag, value in (
            ("--tls-ca", self.ca), ("--tls-cert", self.cert), ("--tls-key", self.key),
            ("--tls-password-file", self.password_file), ("--tls-insecure", self.insecure),
            ("--tls-pkcs12", self.pkcs12)) if value]  # fmt: skip


@dataclass(frozen=True)
class SaslFlags:
    """The tunnel logs in to the brokers as this user (the password never a flag's value:
    it would show in `ps`); with OAUTHBEARER, with tokens the token endpoint gives this
    client (the client credentials grant; its secret never a flag's value either)."""

    mechanism: str | None = None
    username: str | None = None
    password_file: Path | None = None
    password_env: str | None = None
    token_endpoint: str | None = None
    client_id: str | None = None
    client_secret_file: Path | None = None
    client_secret_env: str | None = None
    scope: str | None = None
    token_endpoint_ca: Path | None = None
    token_endpoint_insecure: bool = False  # consent to an http:// endpoint elsewhere

    def given(self) -> list[str]:
        return [flag for flag, value in (
            ("--sasl-mechanism", self.mechanism), ("--sasl-username", self.username),
            ("--sasl-password-file", self.password_file),
            ("--sasl-password-env", self.password_env), *self.oauth_given()
        ) if value is not None]  # fmt: skip

    def oauth_given(self) -> list[tuple[str, object]]:
        return [(flag, value) for flag, value in (
            ("--sasl-token-endpoint", self.token_endpoint), ("--sasl-client-id", self.client_id),
            ("--sasl-client-secret-file", self.client_secret_file),
            ("--sasl-client-secret-env", self.client_secret_env), ("--sasl-scope", self.scope),
            ("--sasl-token-endpoint-ca", self.token_endpoint_ca),
            ("--sasl-token-endpoint-insecure", self.token_endpoint_insecure or None),
        ) if value is not None]  # fmt: skip

    def warnings(self) -> list[str]:
        """What the user must hear on every start."""
        if self.token_endpoint is None or not in_the_clear(self.token_endpoint):
            return []
        host = urllib.parse.urlsplit(self.token_endpoint).hostname
        return [f"--sasl-token-endpoint-insecure: the client secret of {self.client_id} and its "
                f"tokens travel unencrypted to {host}: anyone on the path can read them and "
                "log in as the client; give the endpoint's https:// URL instead"]  # fmt: skip


def in_the_clear(url: str) -> bool:
    """An http:// URL whose host is not this machine (127.0.0.0/8, ::1, localhost): what is
    sent there (the grant's client secret, the token back) crosses a network unencrypted.
    The host as written, not resolved: a name is only as loopback as its resolver says."""
    split = urllib.parse.urlsplit(url)
    host = (split.hostname or "").lower()
    if split.scheme != "http" or host == "localhost":
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return True  # a name
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not address.is_loopback


@dataclass(frozen=True)
class RecordFlags:
    directory: Path | None = None
    rotate: str = "64MiB"
    payloads: bool = False


@dataclass(frozen=True)
class Limits:
    connect_timeout: float = 10.0
    start_timeout: float = 15.0  # 0: no wait
    max_connections: int = 1024
    max_brokers: int = 256


@dataclass(frozen=True)
class Running:
    table: bool = True
    loop: str = "auto"
    mode: str = "rewrite"
    zero_copy: bool = True


@dataclass(frozen=True)
class Guard:
    """What the tunnel refuses (--read-only, --deny-api, --allow-api) and keeps apart
    (--isolate)."""

    read_only: bool = False
    deny_api: tuple[str, ...] = ()
    allow_api: tuple[str, ...] = ()
    isolate: bool = False  # --isolate: the clients' own ids
    isolate_suffix: str | None = None
    isolate_from_deployed: bool = False  # isolated groups start at the deployed offsets


@dataclass(frozen=True)
class UpOptions:
    reach: Reach = field(default_factory=Reach)
    kube: KubeOptions = field(default_factory=KubeOptions)
    serving: Serving = field(default_factory=Serving)
    dns: DnsOptions = field(default_factory=DnsOptions)
    tls: TlsFlags = field(default_factory=TlsFlags)
    sasl: SaslFlags = field(default_factory=SaslFlags)
    record: RecordFlags = field(default_factory=RecordFlags)
    limits: Limits = field(default_factory=Limits)
    running: Running = field(default_factory=Running)
    guard: Guard = field(default_factory=Guard)

    def target(self) -> dict[str, str]:
        """The cluster these options reach, as the user named it: `run` joins a running
        tunnel whose target is the same, rather than start a second one."""
        reach, kube = self.reach, self.kube
        named = {"via": reach.via, "bootstrap": reach.bootstrap, "exec": reach.exec_template,
                 "map": " ".join(reach.mappings), "brokers": " ".join(reach.brokers),
                 "context": kube.context, "namespace": kube.namespace,
                 "kubeconfig": kube.kubeconfig, "target": kube.target,
                 "selector": kube.selector, "kafka_port": kube.kafka_port}  # fmt: skip
        return {key: "" if value is None else str(value) for key, value in named.items()}


@dataclass(frozen=True)
class Checked:
    """What the flags say, parsed: the values the tunnel is built from."""

    via: str
    listen: tuple[str, int]
    metrics_listen: tuple[str, int] | None
    dns_listen: tuple[str, int] | None
    broker_ports: dict[int, int]
    mappings: dict[tuple[str, int], tuple[str, int]]
    services: tuple[ServiceRequest, ...]
    rotate_bytes: int
    policy: Policy | None = None  # what the tunnel refuses
    isolation: Isolation | None = None  # the clients' ids mapped (--isolate)


def check(options: UpOptions) -> Checked:
    """Every flag on its own and with the others it goes with (BadParameter naming it)."""
    from kafkatunnel.dns.resolver import METHODS

    reach, serving, tls, dns = options.reach, options.serving, options.tls, options.dns
    namespace = options.kube.namespace
    if namespace is not None:
        _checked("--namespace", check_namespace, namespace)
    via = reach.via or default_via(reach.exec_template, reach.mappings)
    mappings = _check_reach(reach, via)
    if via != "kubectl":
        for flag, given, what in (
            ("--kafka-user", tls.kafka_user, "reads the user's secret with kubectl"),
            ("--service", serving.services, "forwards Kubernetes services"),
            ("--companions", serving.companions, "forwards Kubernetes services"),
        ):
            if given:
                raise typer.BadParameter(f"{what}: add --via kubectl", param_hint=flag)
    services = tuple(_checked("--service", ServiceRequest.parse, s) for s in serving.services)
    names = [s.name for s in services]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise typer.BadParameter(f"service {twice[0]} is named twice", param_hint="--service")
    if serving.container_network is not None and not serving.for_containers:
        raise typer.BadParameter("goes with --for-containers", param_hint="--container-network")
    if not tls.enabled and tls.given_without_tls():
        raise typer.BadParameter(f"{tls.given_without_tls()[0]} goes with --tls",
                                 param_hint="--tls")  # fmt: skip
    if tls.pkcs12 is not None and (tls.cert is not None or tls.key is not None):
        raise typer.BadParameter("give --tls-pkcs12 or --tls-cert/--tls-key, not both",
                                 param_hint="--tls-pkcs12")  # fmt: skip
    if dns.setup not in ("none", *METHODS):
        raise typer.BadParameter(f"{dns.setup!r} is not one of none, {', '.join(METHODS)}",
                                 param_hint="--dns-setup")  # fmt: skip
    if options.running.loop not in LOOPS:
        raise typer.BadParameter(f"{options.running.loop!r} is not one of {', '.join(LOOPS)}",
                                 param_hint="--loop")  # fmt: skip
    _check_sasl(options.sasl, tls, options.running.mode)
    if options.record.payloads and options.record.directory is None:
        raise typer.BadParameter("goes with --record DIR", param_hint="--record-payloads")
    listen = parse_listen(serving.listen)
    metrics_listen = (None if serving.metrics_listen is None
                      else parse_listen(serving.metrics_listen, "--metrics-listen"))  # fmt: skip
    dns_listen = parse_listen(dns.listen, "--dns-listen") if dns.enabled else None
    broker_ports = parse_broker_ports(serving.broker_ports)
    check_ports_apart([
        ("--listen", *listen),
        *((f"--broker-port {node}={port}", listen[0], port) for node, port in broker_ports.items()),
        *([("--metrics-listen", *metrics_listen)] if metrics_listen else []),
        *([("--dns-listen", *dns_listen)] if dns_listen else []),
        *((f"--service {s}", listen[0], s.local_port) for s in services if s.local_port),
    ])  # fmt: skip
    return Checked(
        via=via,
        listen=listen,
        metrics_listen=metrics_listen,
        dns_listen=dns_listen,
        broker_ports=broker_ports,
        mappings=mappings,
        services=services,
        rotate_bytes=parse_size(options.record.rotate, "--record-rotate"),
        policy=check_guard(options.guard),
        isolation=check_isolation(options.guard),
    )


def check_guard(guard: Guard) -> Policy | None:
    """The policy the guard's flags make (None: nothing refused); an unknown API name or a
    contradiction names the flag and the valid names."""
    from kafkatunnel.protocol import Policy, PolicyError

    try:
        return Policy.of(guard.read_only, guard.deny_api, guard.allow_api, guard.isolate)
    except PolicyError as cause:
        raise typer.BadParameter(str(cause), param_hint=cause.flag) from None


def check_isolation(guard: Guard, user: str | None = None) -> Isolation | None:
    """--isolate's mapping, with --isolate-suffix or kt-USER (the local user's name in
    Kafka's name characters); None without --isolate. A bad suffix names the flag."""
    from kafkatunnel.protocol import Isolation

    if not guard.isolate:
        if guard.isolate_suffix is not None:
            raise typer.BadParameter("names what --isolate appends: add --isolate",
                                     param_hint="--isolate-suffix")  # fmt: skip
        if guard.isolate_from_deployed:
            raise typer.BadParameter("says where isolated groups start: add --isolate",
                                     param_hint="--isolate-from-deployed")  # fmt: skip
        return None
    suffix = guard.isolate_suffix
    if suffix is None:
        name = re.sub(r"[^A-Za-z0-9_-]+", "-", user or getpass.getuser()).strip("-")
        suffix = f"kt-{name[:60] or 'local'}"
    try:
        return Isolation(suffix, guard.isolate_from_deployed)
    except ValueError as cause:
        raise typer.BadParameter(str(cause).removeprefix("--isolate-suffix "),
                                 param_hint="--isolate-suffix") from None  # fmt: skip


def _check_sasl(sasl: SaslFlags, tls: TlsFlags, mode: str) -> None:
    """--sasl-mechanism with its user and one source of the password, or none of them."""
    given = sasl.given()
    if not given:
        if tls.kafka_user and mode == "transparent" and not tls.show_password:
            raise typer.BadParameter(
                "in transparent mode the tunnel neither logs in nor presents a certificate: "
                "clients do it themselves (--show-password prints a SCRAM user's settings)",
                param_hint="--kafka-user",
            )
        return
    if sasl.mechanism is None:
        raise typer.BadParameter("goes with --sasl-mechanism", param_hint=given[0])
    if sasl.mechanism.upper() not in SASL_MECHANISMS:
        known = ", ".join(SASL_MECHANISMS)
        raise typer.BadParameter(f"{sasl.mechanism!r} is not one of {known}",
                                 param_hint="--sasl-mechanism")  # fmt: skip
    if tls.kafka_user:
        raise typer.BadParameter(
            "--kafka-user and --sasl-mechanism both say who logs in: give one",
            param_hint="--sasl-mechanism",
        )
    if sasl.mechanism.upper() == "OAUTHBEARER":
        _check_oauth(sasl)
    elif sasl.oauth_given():
        raise typer.BadParameter("goes with --sasl-mechanism OAUTHBEARER",
                                 param_hint=sasl.oauth_given()[0][0])  # fmt: skip
    elif not sasl.username:
        raise typer.BadParameter("needs --sasl-username NAME", param_hint="--sasl-mechanism")
    elif (sasl.password_file is None) == (sasl.password_env is None):
        raise typer.BadParameter(
            "needs the password from one place: --sasl-password-file FILE or "
            "--sasl-password-env VARIABLE (never on the command line, where `ps` shows it)",
            param_hint="--sasl-mechanism",
        )
    if mode == "transparent":
        raise typer.BadParameter(
            "the tunnel logs in for its clients in rewrite mode; in transparent mode "
            "clients log in themselves",
            param_hint="--sasl-mechanism",
        )


def _check_oauth(sasl: SaslFlags) -> None:
    """OAUTHBEARER: a token endpoint, a client id and one source of its secret; no user
    or password (the token says who)."""
    for flag, value in (("--sasl-username", sasl.username),
                        ("--sasl-password-file", sasl.password_file),
                        ("--sasl-password-env", sasl.password_env)):  # fmt: skip
        if value is not None:
            raise typer.BadParameter("OAUTHBEARER logs in with a token: give --sasl-client-id "
                                     "and its secret instead", param_hint=flag)  # fmt: skip
    if not sasl.token_endpoint:
        raise typer.BadParameter(
            "OAUTHBEARER needs --sasl-token-endpoint URL (the identity provider's token endpoint)",
            param_hint="--sasl-mechanism",
        )
    url = parse_token_endpoint(sasl.token_endpoint)
    if url.username is not None or url.password is not None:
        raise typer.BadParameter("names a user in the URL: give --sasl-client-id and its "
                                 "secret instead", param_hint="--sasl-token-endpoint")  # fmt: skip
    if sasl.token_endpoint_ca is not None and url.scheme != "https":
        raise typer.BadParameter("goes with an https token endpoint",
                                 param_hint="--sasl-token-endpoint-ca")  # fmt: skip
    if sasl.token_endpoint_insecure and url.scheme != "http":
        raise typer.BadParameter("goes with an http:// token endpoint",
                                 param_hint="--sasl-token-endpoint-insecure")  # fmt: skip
    if in_the_clear(sasl.token_endpoint) and not sasl.token_endpoint_insecure:
        raise typer.BadParameter(
            f"{sasl.token_endpoint!r} would send the client secret unencrypted to "
            f"{url.hostname}: give the endpoint's https:// URL, or "
            "--sasl-token-endpoint-insecure to send it so all the same",
            param_hint="--sasl-token-endpoint",
        )
    if not sasl.client_id:
        raise typer.BadParameter("OAUTHBEARER needs --sasl-client-id ID",
                                 param_hint="--sasl-mechanism")  # fmt: skip
    if (sasl.client_secret_file is None) == (sasl.client_secret_env is None):
        raise typer.BadParameter(
            "needs the client secret from one place: --sasl-client-secret-file FILE or "
            "--sasl-client-secret-env VARIABLE (never on the command line, where `ps` shows "
            "it)",
            param_hint="--sasl-mechanism",
        )


def parse_token_endpoint(text: str) -> urllib.parse.SplitResult:
    """--sasl-token-endpoint as an http(s) URL whose host and port read as --listen's do
    (an IPv6 host in brackets that pair, a port in 1-65535): urllib takes `https://[::1]x/`
    and raises on `http://[::1`, where the flag's error belongs."""
    scheme, _, rest = text.partition("://")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0].rpartition("@")[2]
    try:
        if scheme.lower() not in ("http", "https") or not authority:
            raise ValueError("write http(s)://HOST[:PORT]/PATH")
        split_address(authority, default_port=443)
        url = urllib.parse.urlsplit(text)
    except ValueError as cause:
        raise typer.BadParameter(f"{text!r} is not an http(s) URL: {cause}",
                                 param_hint="--sasl-token-endpoint") from None  # fmt: skip
    return url


def _check_reach(reach: Reach, via: str) -> dict[tuple[str, int], tuple[str, int]]:
    from kafkatunnel.tunnel.forwarders import check_template, parse_mapping

    if via not in VIA:
        raise typer.BadParameter(f"{via!r} is not one of {', '.join(VIA)}", param_hint="--via")
    if via == "kubectl" and (reach.exec_template or reach.mappings):
        raise typer.BadParameter("--exec and --map do not go with --via kubectl",
                                 param_hint="--via")  # fmt: skip
    if via == "exec":
        if not reach.exec_template:
            raise typer.BadParameter(
                'needs a command template, e.g. --exec "ssh bastion nc {host} {port}"',
                param_hint="--via exec",
            )
        _checked("--exec", check_template, reach.exec_template)
    elif reach.exec_template:
        raise typer.BadParameter("--exec goes with --via exec", param_hint="--exec")
    if reach.mappings and via != "direct":
        raise typer.BadParameter(f"--map goes with --via direct, not {via}", param_hint="--map")
    if reach.bootstrap is None and via != "kubectl":
        raise typer.BadParameter("is required with --via exec and --via direct",
                                 param_hint="--bootstrap")  # fmt: skip
    return _checked("--map", parse_mapping, list(reach.mappings))


def default_via(exec_template: str | None, mappings: tuple[str, ...]) -> str:
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


def _checked(flag: str, parse: Callable[[T], R], value: T) -> R:
    """parse(value), a ValueError reported as the flag's."""
    try:
        return parse(value)
    except ValueError as cause:  # ServiceError among them
        raise typer.BadParameter(str(cause), param_hint=flag) from None


def parse_broker_ports(entries: tuple[str, ...]) -> dict[int, int]:
    """--broker-port NODE_ID=PORT entries, each node once."""
    ports: dict[int, int] = {}
    for entry in entries:
        node, sep, port = (part.strip() for part in entry.partition("="))
        try:
            if not sep or not (node.isascii() and node.isdigit()) or int(node) > MAX_NODE_ID:
                raise ValueError("expected NODE_ID=PORT, e.g. 1=19093 (node ids count from 0)")
            number = parse_port(port)
        except ValueError as cause:
            raise typer.BadParameter(f"{entry!r}: {cause}", param_hint="--broker-port") from None
        if int(node) in ports:
            twice = f"node {int(node)} is given twice ({int(node)}={ports[int(node)]}, {entry})"
            raise typer.BadParameter(twice, param_hint="--broker-port")
        ports[int(node)] = number
    return ports


def parse_listen(listen: str, flag: str = "--listen") -> tuple[str, int]:
    try:
        return split_address(listen)
    except ValueError as cause:
        raise typer.BadParameter(f"{cause}; expected HOST:PORT, e.g. 127.0.0.1:9092",
                                 param_hint=flag) from None  # fmt: skip


def check_ports_apart(listeners: list[tuple[str, str, int]]) -> None:
    """Each of the tunnel's own TCP listeners (flag, host, port) on a port of its own: two
    on one port would meet as "in use by python", the tunnel itself, at start."""
    for index, (flag, host, port) in enumerate(listeners):
        for other, other_host, other_port in listeners[:index]:
            shared = host == other_host or WILDCARDS & {host, other_host}
            if port == other_port and shared:
                raise typer.BadParameter(f"port {port} is {other}'s already: give each "
                                         "listener a port of its own", param_hint=flag)  # fmt: skip


def parse_size(text: str, flag: str) -> int:
    number = text.strip().rstrip("bBiIkKmMgG")
    unit = text.strip()[len(number) :].lower()
    if not (number.isascii() and number.isdigit()) or unit not in SIZE_UNITS or int(number) == 0:
        raise typer.BadParameter(f"{text!r}: expected a size like 64MiB or 500MB", param_hint=flag)
    return int(number) * SIZE_UNITS[unit]
