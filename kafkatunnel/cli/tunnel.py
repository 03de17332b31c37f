"""`kafkatunnel up` and `kafkatunnel status`: up's flags (up_options.py) and the running
tunnel's table. What `up` runs once its flags are checked is up_run.py, loaded then: --help,
`status` and a mistyped flag never load the tunnel, kio or cryptography."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from kafkatunnel.cli.background import detach as run_detached
from kafkatunnel.cli.background import running_or_exit
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
from kafkatunnel.cli.output import make_console
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
)
from kafkatunnel.tunnel.control import fetch
from kafkatunnel.tunnel.limits import DEFAULT_MAX_BROKERS, DEFAULT_MAX_CONNECTIONS
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
    sasl_token_endpoint_insecure: bool = typer.Option(
        False,
        "--sasl-token-endpoint-insecure",
        help="OAUTHBEARER: send the client secret to an http:// token endpoint on another "
        "machine, unencrypted (a network you trust only).",
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
    isolate: bool = typer.Option(
        False,
        "--isolate",
        help="Give this laptop's clients their own consumer groups, share groups and "
        "transactional ids (GROUP.SUFFIX on the cluster), so a local run of a deployed "
        "application never joins, fences or drains the deployed one.",
        rich_help_panel=GUARD,
    ),
    isolate_suffix: str | None = typer.Option(
        None,
        "--isolate-suffix",
        metavar="SUFFIX",
        help="What --isolate appends to each id (default: kt-USER, your user name).",
        rich_help_panel=GUARD,
    ),
    isolate_from_deployed: bool = typer.Option(
        False,
        "--isolate-from-deployed",
        help="An isolated consumer group with no offsets of its own starts where the "
        "deployed group of its name has committed (read, never changed).",
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
    given = dict(locals())
    console = make_console()
    if detach:
        run_detached(console, sys.argv[1:])
        return
    options = up_options(given)
    checked = check(options)  # a mistyped flag is said before the tunnel is loaded
    from kafkatunnel.cli.up_run import run_up

    run_up(console, options, checked)


def up_options(given: Mapping[str, Any]) -> UpOptions:
    """`up`'s parameters (by their names, as click hands them) as the options they say:
    for `up` itself, and for `run`, which parses the same flags."""
    g = types.SimpleNamespace(**given)
    return UpOptions(
        reach=Reach(g.bootstrap, g.via, g.exec_template, tuple(g.mapping), tuple(g.broker)),
        kube=KubeOptions(g.context, g.namespace, g.kubeconfig, g.target, g.selector,
                         g.kafka_port),
        serving=Serving(g.listen, g.advertise, g.for_containers, g.container_network,
                        tuple(g.broker_port), g.metrics_listen, tuple(g.service), g.companions),
        dns=DnsOptions(g.dns, g.dns_listen, g.dns_setup, g.dns_first_address, tuple(g.dns_zone),
                       (g.namespace,) if g.namespace else ()),
        tls=TlsFlags(g.tls, g.tls_ca, g.tls_cert, g.tls_key, g.tls_pkcs12, g.tls_password_file,
                     g.tls_insecure, g.client_tls, g.kafka_user, g.show_password),
        sasl=SaslFlags(g.sasl_mechanism, g.sasl_username, g.sasl_password_file,
                       g.sasl_password_env, g.sasl_token_endpoint, g.sasl_client_id,
                       g.sasl_client_secret_file, g.sasl_client_secret_env, g.sasl_scope,
                       g.sasl_token_endpoint_ca, g.sasl_token_endpoint_insecure),
        record=RecordFlags(None if g.record is None else Path(g.record), g.record_rotate,
                           g.record_payloads),
        limits=Limits(g.connect_timeout, g.start_timeout, g.max_connections, g.max_brokers),
        running=Running(g.table, g.loop, g.mode, g.zero_copy),
        guard=Guard(g.read_only, tuple(g.deny_api), tuple(g.allow_api), g.isolate,
                    g.isolate_suffix, g.isolate_from_deployed),
    )  # fmt: skip


def status(as_json: bool = json_option(), port: int | None = port_option()) -> None:
    """Show the running tunnel's brokers, forwards and traffic."""
    run_status(make_console(), as_json, port)


def run_status(console: Console, as_json: bool, port: int | None) -> None:
    tunnels = running_or_exit(console, port)
    states = [json.loads(fetch(state["control"], "/status")) for state in tunnels.values()]
    if as_json:
        typer.echo(json.dumps(states[0] if len(states) == 1 else states, indent=2))
        return
    for state in states:
        console.print(status_table(state, cut=console.is_terminal))
