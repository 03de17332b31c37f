"""`kafkatunnel up` and `kafkatunnel status`: flag checking and the terminal around Tunnel."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.live import Live

from kafkatunnel.capture.recorder import DEFAULT_ROTATE_BYTES
from kafkatunnel.dns.resolver import METHODS
from kafkatunnel.dns.resolver import setup as resolver_setup
from kafkatunnel.dns.resolver import teardown as resolver_teardown
from kafkatunnel.kube.forwarder import KubectlForwarder
from kafkatunnel.kube.kubectl import Kubectl, KubectlError
from kafkatunnel.probe import split_address
from kafkatunnel.tunnel import (
    DirectForwarder,
    ExecForwarder,
    Forwarder,
    PortInUse,
    Tunnel,
    TunnelConfig,
    parse_mapping,
)
from kafkatunnel.tunnel.control import fetch, running_tunnels
from kafkatunnel.tunnel.view import status_table

LOOPBACK = ("127.0.0.1", "::1", "localhost")
VIA = ("exec", "direct", "kubectl")


@dataclass
class KubeOptions:
    context: str | None = None
    namespace: str | None = None
    kubeconfig: str | None = None
    target: str | None = None
    selector: str | None = None
    kafka_port: int = 9092

    def default_bootstrap(self, forwarder: Forwarder) -> str:
        """The first Kafka pod, found now (so errors show before anything is bound)."""
        assert isinstance(forwarder, KubectlForwarder)
        try:
            asyncio.run(forwarder.prepare())
        except KubectlError as error:
            Console(stderr=True).print(f"[red]error:[/] {error}")
            raise typer.Exit(2) from None
        return forwarder.default_bootstrap(self.kafka_port)


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


def parse_listen(listen: str) -> tuple[str, int]:
    try:
        host, port = split_address(listen)
    except ValueError:
        raise typer.BadParameter(f"{listen!r}: expected HOST:PORT, e.g. 127.0.0.1:9092") from None
    if not 0 < port < 65536:
        raise typer.BadParameter(f"port {port} is not between 1 and 65535")
    return host, port


@dataclass
class DnsOptions:
    enabled: bool = False
    listen: str = "127.0.0.1:53"
    setup: str = "auto"  # a resolver method, or "none"
    first_address: str = "127.0.0.2"


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
        if directory is None:
            if payloads:
                raise typer.BadParameter("goes with --record DIR", param_hint="--record-payloads")
            return None
        return cls(Path(directory), parse_size(rotate, "--record-rotate"), payloads)


def run_up(
    console: Console,
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
) -> None:
    try:
        split_address(bootstrap)
    except ValueError:
        raise typer.BadParameter(
            f"{bootstrap!r}: expected the advertised HOST:PORT of a broker, e.g. "
            "kafka-0.kafka-headless.shop.svc.cluster.local:9092",
            param_hint="--bootstrap",
        ) from None
    host, port = parse_listen(listen)
    if host not in LOOPBACK:
        console.print(
            f"[yellow]warning: listening on {host}, not loopback: other machines can reach "
            "your cluster through this tunnel[/]"
        )
    dns = dns or DnsOptions()
    for entry in brokers or []:
        try:
            split_address(entry)
        except ValueError:
            raise typer.BadParameter(
                f"{entry!r}: expected HOST:PORT", param_hint="--broker"
            ) from None
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
            dns_listen=parse_listen(dns.listen) if dns.enabled else None,
            first_dns_address=dns.first_address,
            brokers=list(brokers or []),
            record_dir=record.directory if record else None,
            record_rotate_bytes=record.rotate_bytes if record else DEFAULT_ROTATE_BYTES,
            record_payloads=record.payloads if record else False,
            zero_copy=zero_copy,
        )
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--mode") from None
    try:
        run_loop(_serve(console, Tunnel(config, forwarder), table, dns), loop)
    except (PortInUse, OSError, KubectlError) as error:
        console.print(f"[red]error:[/] {error}")
        raise typer.Exit(2) from None


LOOPS = ("auto", "asyncio", "uvloop")


def run_loop(main: Coroutine[Any, Any, None], loop: str) -> None:
    """Run on uvloop (libuv: less CPU per byte forwarded) when asked or, with "auto", when
    it is installed; otherwise on asyncio's own loop."""
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
            uvloop.run(main)
            return
    asyncio.run(main)


async def _serve(console: Console, tunnel: Tunnel, table: bool, dns: DnsOptions) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await tunnel.start()
    print(f"bootstrap.servers={tunnel.bootstrap_servers}", flush=True)
    if tunnel.recorder is not None:
        print(f"recording to {tunnel.recorder.directory}", flush=True)
    configured = False
    try:
        if tunnel.dns is not None and dns.setup != "none":
            status = tunnel.status()["dns"]
            plan = resolver_setup(
                method=dns.setup,
                names=status["names"],
                domains=status["domains"],
                server=parse_listen(status["listen"]),
            )
            configured = True
            print(f"resolver: {plan.method}: " + "; ".join(plan.steps), flush=True)
        if table and console.is_terminal:
            with Live(status_table(tunnel.status()), console=console, refresh_per_second=4) as live:
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 0.5)
                    live.update(status_table(tunnel.status()))
        else:
            for endpoint in tunnel.endpoints():
                node = "bootstrap" if endpoint.node_id is None else f"broker {endpoint.node_id}"
                print(f"{node}: {endpoint.local} -> {endpoint.advertised}", flush=True)
            await stop.wait()
    finally:
        if configured:
            for step in resolver_teardown():
                print(f"resolver: {step}", file=sys.stderr, flush=True)
        await tunnel.stop()
        print("tunnel closed", file=sys.stderr, flush=True)


def running_or_exit(console: Console, port: int | None) -> dict[int, dict[str, Any]]:
    """The running tunnels (the one on `port`, if given), or exit 1 saying there is none."""
    tunnels = running_tunnels()
    if port is not None:
        tunnels = {p: s for p, s in tunnels.items() if p == port}
    if not tunnels:
        where = f" on port {port}" if port is not None else ""
        console.print(f"no running tunnel{where}: start one with `kafkatunnel up`", style="red")
        raise typer.Exit(1)
    return tunnels


def run_status(console: Console, as_json: bool, port: int | None) -> None:
    tunnels = running_or_exit(console, port)
    states = [json.loads(fetch(state["control"], "/status")) for state in tunnels.values()]
    if as_json:
        typer.echo(json.dumps(states[0] if len(states) == 1 else states, indent=2))
        return
    for state in states:
        console.print(status_table(state))
