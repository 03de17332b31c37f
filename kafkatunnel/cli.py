"""The `kafkatunnel` command: a thin typer layer over the library."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from kafkatunnel.protocol.coordinator import (
    DEFAULT_PARTITIONS,
    GROUP_TOPIC,
    TRANSACTION_TOPIC,
    partition_for,
)

app = typer.Typer(
    help="Reach a Kafka cluster inside Kubernetes from your laptop, every broker and every "
    "consumer group included.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
console = Console()


# Options `up` and `doctor` share (and so share a setting name in profiles and KAFKATUNNEL_*).
def context_option() -> Any:
    return typer.Option(None, help="--via kubectl: the kubectl context.")


def namespace_option() -> Any:
    return typer.Option(
        None, "--namespace", "-n", help="--via kubectl: the namespace of the Kafka pods."
    )


def kubeconfig_option() -> Any:
    return typer.Option(None, help="--via kubectl: the kubeconfig file.")


@app.callback()
def main_options(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None,
        "--config",
        envvar="KAFKATUNNEL_CONFIG",
        help="Settings file (default: ./kafkatunnel.toml when present).",
    ),
    profile: str | None = typer.Option(
        None,
        "--profile",
        envvar="KAFKATUNNEL_PROFILE",
        help="A profile of the settings file.",
    ),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More log (-vv: debug)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Errors only."),
) -> None:
    """Reach a Kafka cluster inside Kubernetes from your laptop, every broker and every
    consumer group included. Settings: flags > KAFKATUNNEL_* > kafkatunnel.toml profile."""
    from kafkatunnel.cli_config import apply, configure_logging

    configure_logging(verbose, quiet)
    apply(ctx, config, profile)


@app.command()
def coordinator(
    key: str = typer.Argument(..., help="A consumer group id (or a transactional id)."),
    partitions: int = typer.Option(
        DEFAULT_PARTITIONS, min=1, help="Partitions of __consumer_offsets / __transaction_state."
    ),
    transactional: bool = typer.Option(False, help="KEY is a transactional id."),
    bootstrap: str | None = typer.Option(
        None, help="Ask this cluster (or tunnel) which broker coordinates KEY."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Which partition, and with --bootstrap which broker, coordinates a group."""
    topic = TRANSACTION_TOPIC if transactional else GROUP_TOPIC
    result: dict[str, object] = {
        "key": key,
        "transactional": transactional,
        "topic": topic,
        "partition": partition_for(key, partitions),
        "partitions": partitions,
    }
    if bootstrap:
        from kafkatunnel.probe import find_coordinator

        found = find_coordinator(bootstrap, key, transactional=transactional)
        result.update(
            coordinator={"node_id": found.node_id, "address": found.address},
            error_code=found.error_code,
        )
    if as_json:
        typer.echo(json.dumps(result))
        return
    console.print(
        f"{key!r} -> partition {result['partition']} of {topic} ({partitions} partitions)"
    )
    if bootstrap:
        console.print(f"coordinator: {result['coordinator']}")


@app.command()
def up(
    bootstrap: str | None = typer.Option(
        None,
        help="The advertised HOST:PORT of any broker, as the cluster names it "
        "(with --via kubectl: the first Kafka pod, by default).",
    ),
    via: str = typer.Option("exec", help="How to reach brokers: exec, direct or kubectl."),
    exec_template: str | None = typer.Option(
        None,
        "--exec",
        help='Command opening a stream to {host}:{port}, e.g. "ssh b nc {host} {port}".',
    ),
    mapping: list[str] = typer.Option(
        [],
        "--map",
        help="With --via direct: ADVERTISED_HOST:PORT=REACHABLE_HOST:PORT (repeatable).",
    ),
    listen: str = typer.Option(
        "127.0.0.1:9092", help="Bootstrap listener; brokers get the following ports."
    ),
    broker_port: list[str] = typer.Option(
        [], "--broker-port", help="Fix a broker's local port: NODE_ID=PORT (repeatable)."
    ),
    connect_timeout: float = typer.Option(10.0, help="Seconds to open a stream to a broker."),
    table: bool = typer.Option(True, help="Show the live table (on a terminal)."),
    loop: str = typer.Option(
        "auto", help="Event loop: auto (uvloop if installed), asyncio, uvloop."
    ),
    mode: str = typer.Option(
        "rewrite", help="rewrite: clients see tunnel addresses; transparent: bytes untouched."
    ),
    dns: bool = typer.Option(False, help="Serve the brokers' names, each on its own loopback."),
    dns_listen: str = typer.Option("127.0.0.1:53", help="Where the DNS shim listens."),
    dns_setup: str = typer.Option(
        "auto",
        help="Point the resolver at the shim: auto, hosts, resolver-dir, systemd-resolved, none.",
    ),
    dns_first_address: str = typer.Option("127.0.0.2", help="Broker i gets this address + i."),
    broker: list[str] = typer.Option(
        [], "--broker", help="An advertised HOST:PORT known up front (repeatable; TLS clusters)."
    ),
    context: str | None = context_option(),
    namespace: str | None = namespace_option(),
    kubeconfig: str | None = kubeconfig_option(),
    target: str | None = typer.Option(
        None, help="--via kubectl: statefulset/NAME or svc/NAME whose pods are the brokers."
    ),
    selector: str | None = typer.Option(
        None, "--selector", "-l", help="--via kubectl: a label selector for the broker pods."
    ),
    kafka_port: int = typer.Option(9092, help="--via kubectl without --bootstrap: the port."),
    record: str | None = typer.Option(
        None, help="Record the traffic as pcapng files in this directory (see `verify`)."
    ),
    record_rotate: str = typer.Option("64MiB", help="Start a new recording file past this size."),
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
    if detach:
        from kafkatunnel.cli_background import detach as run_detached

        run_detached(console, sys.argv[1:])
        return
    from kafkatunnel.cli_tunnel import (
        DnsOptions,
        KubeOptions,
        RecordOptions,
        build_forwarder,
        run_up,
    )

    kube = KubeOptions(context, namespace, kubeconfig, target, selector, kafka_port)
    forwarder = build_forwarder(via, exec_template, mapping, kube)
    bootstrap = bootstrap or (kube.default_bootstrap(forwarder) if via == "kubectl" else None)
    if bootstrap is None:
        raise typer.BadParameter(
            "is required with --via exec and --via direct", param_hint="--bootstrap"
        )
    dns_options = DnsOptions(dns, dns_listen, dns_setup, dns_first_address)
    record_options = RecordOptions.parse(record, record_rotate, record_payloads)
    run_up(
        console, bootstrap, forwarder, listen, broker_port, connect_timeout, table, loop,
        mode, dns_options, broker, record_options, zero_copy,
    )  # fmt: skip


@app.command()
def status(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    port: int | None = typer.Option(None, help="The tunnel whose bootstrap port this is."),
) -> None:
    """Show the running tunnel's brokers, forwards and traffic."""
    from kafkatunnel.cli_tunnel import run_status

    run_status(console, as_json, port)


@app.command()
def down(
    port: int | None = typer.Option(None, help="The tunnel whose bootstrap port this is."),
    everything: bool = typer.Option(False, "--all", help="Stop every running tunnel."),
) -> None:
    """Stop a tunnel running in the background (or in another shell)."""
    from kafkatunnel.cli_background import down as stop

    stop(console, port, everything)


dns_app = typer.Typer(help="Point this machine's resolver at a running tunnel's DNS shim.")
app.add_typer(dns_app, name="dns")


@dns_app.command("setup")
def dns_setup_command(
    method: str = typer.Option("auto", help="auto, systemd-resolved, resolver-dir or hosts."),
    port: int | None = typer.Option(None, help="The tunnel whose bootstrap port this is."),
    dry_run: bool = typer.Option(False, help="Print what would be done, change nothing."),
    hosts_file: str = typer.Option("/etc/hosts", help="For --method hosts."),
    resolver_dir: str = typer.Option("/etc/resolver", help="For --method resolver-dir (macOS)."),
    apply: bool = typer.Option(False, help="macOS: also add the lo0 aliases (runs sudo)."),
) -> None:
    """Route the cluster's names to the running tunnel's DNS shim (undo: dns teardown)."""
    from kafkatunnel.cli_dns import run_dns_setup

    run_dns_setup(console, method, port, dry_run, hosts_file, resolver_dir, apply)


@dns_app.command("teardown")
def dns_teardown_command(
    dry_run: bool = typer.Option(False, help="Print what would be undone, change nothing."),
) -> None:
    """Undo everything `dns setup` (or `up --dns`) did, also after a crash."""
    from kafkatunnel.dns.resolver import teardown

    steps = teardown(dry_run=dry_run)
    for step in steps or ["nothing to undo"]:
        console.print(("would " if dry_run else "") + step)


@app.command()
def verify(
    paths: list[str] = typer.Argument(
        None, help="Recordings: pcap/pcapng files, directories, or Hadoop URIs (hdfs://...)."
    ),
    master: str = typer.Option("local[*]", help="Spark master URL (spark://host:7077, ...)."),
    json_file: str | None = typer.Option(
        None, "--json", help="Write the report as JSON to this file (- for stdout)."
    ),
    html_file: str | None = typer.Option(None, "--html", help="Write a one-file HTML report."),
    in_process: bool = typer.Option(False, help="Run without Spark (small recordings)."),
    replay_against: str | None = typer.Option(
        None, help="A running tunnel's HOST:PORT: re-issue read-only look-ups for every group."
    ),
) -> None:
    """Did every consumer group and transactional id talk to its coordinator? Exit 0 only
    when nothing is misrouted or leaked."""
    from kafkatunnel.cli_verify import run_verify

    raise typer.Exit(
        run_verify(console, paths or [], master, json_file, html_file, in_process, replay_against)
    )


@app.command()
def doctor(
    bootstrap: str | None = typer.Option(
        None, help="The tunnel's bootstrap HOST:PORT (default: the running tunnel's)."
    ),
    port: int | None = typer.Option(None, help="The running tunnel whose bootstrap port this is."),
    via: str | None = typer.Option(
        None, help="kubectl: also check kubectl, its context and RBAC (default: as the tunnel)."
    ),
    context: str | None = context_option(),
    namespace: str | None = namespace_option(),
    kubeconfig: str | None = kubeconfig_option(),
    resolver: str | None = typer.Option(
        None, help="Resolve broker names with this DNS server (HOST:PORT), not the system's."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Check what working consumer groups need, each with its fix: kubectl, context, RBAC,
    broker names, each broker through the tunnel, and a group on each broker."""
    from kafkatunnel.cli_doctor import run_doctor

    code = run_doctor(console, bootstrap, port, via, context, namespace, kubeconfig, resolver,
                      as_json)  # fmt: skip
    raise typer.Exit(code)


config_app = typer.Typer(help="Where the settings of `up` and `doctor` come from.")
app.add_typer(config_app, name="config")


@config_app.command(
    "show", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def config_show(
    ctx: typer.Context,
    command: str = typer.Option("up", help="The command whose settings to show: up or doctor."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The effective settings and where each came from (flag, environment, profile or
    default). Flags after `--` are taken as the command's own: `config show -- -n shop`."""
    from kafkatunnel.cli_config import CONFIGURABLE, show

    if command not in CONFIGURABLE:
        raise typer.BadParameter(f"{command!r} is not one of {', '.join(CONFIGURABLE)}")
    show(ctx, console, command, list(ctx.args), as_json)


@app.command()
def demo(
    record_dir: str | None = typer.Option(
        None, help="Keep the recordings here (default: a new temporary directory)."
    ),
    spark: bool = typer.Option(True, help="Verify with Spark (--no-spark: in one process)."),
) -> None:
    """Bring up the embedded local cluster, show the problem and the fix, and verify the
    recorded traffic."""
    from pathlib import Path

    from kafkatunnel.demo import run_demo

    report = run_demo(console, Path(record_dir) if record_dir else None, spark)
    raise typer.Exit(0 if report.ok else 1)


def main() -> None:
    """The console script: the typer app, with KAFKATUNNEL_* variables for every setting."""
    from kafkatunnel.cli_config import add_environment_variables

    command = typer.main.get_command(app)
    add_environment_variables(command)  # type: ignore[arg-type]
    command(prog_name="kafkatunnel")
