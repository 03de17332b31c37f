"""`kafkatunnel doctor` on the terminal: which tunnel to check, and the table of results."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

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
from kafkatunnel.cli.up_options import KubeOptions
from kafkatunnel.hostnames import split_address
from kafkatunnel.tunnel.control import fetch, running_tunnels

STYLE = {"pass": "green", "fail": "bold red", "skip": "dim", "warn": "yellow"}


def doctor(
    bootstrap: str | None = typer.Option(
        None,
        metavar="HOST:PORT",
        help="The tunnel's bootstrap HOST:PORT (default: the running tunnel's).",
    ),
    port: int | None = port_option(),
    via: str | None = typer.Option(
        None,
        metavar="kubectl",
        help="kubectl: also check kubectl, its context and RBAC (default: as the running "
        "tunnel; with none, as `up` would choose).",
    ),
    context: str | None = context_option(),
    namespace: str | None = namespace_option(),
    kubeconfig: str | None = kubeconfig_option(),
    target: str | None = target_option(),
    selector: str | None = selector_option(),
    kafka_port: int | None = kafka_port_option(),
    resolver: str | None = typer.Option(
        None,
        metavar="HOST:PORT",
        help="Resolve broker names with this DNS server, not the system's.",
    ),
    as_json: bool = json_option(),
) -> None:
    """Check what working consumer groups need, each with its fix: kubectl, context, RBAC,
    broker names, each broker through the tunnel, and a group on each broker. With no tunnel
    running: whether `kafkatunnel up` with the same flags can start."""
    kube = KubeOptions(context, namespace, kubeconfig, target, selector, kafka_port)
    code = run_doctor(make_console(), bootstrap, port, via, kube, resolver, as_json)
    raise typer.Exit(code)


def run_doctor(
    console: Console,
    bootstrap: str | None,
    port: int | None,
    via: str | None,
    kube: KubeOptions,
    resolver: str | None,
    as_json: bool,
) -> int:
    from kafkatunnel.doctor import (
        FAIL,
        StartCheck,
        Subject,
        dns_server_resolve,
        run_checks,
        subject_from_status,
        system_resolve,
    )
    from kafkatunnel.kube.forwarder import KubectlForwarder
    from kafkatunnel.kube.kubectl import Kubectl

    for flag, address, what in (("--bootstrap", bootstrap, "the tunnel's HOST:PORT, e.g. "
                                 "127.0.0.1:9092"),
                                ("--resolver", resolver, "the DNS server's HOST:PORT, e.g. "
                                 "127.0.0.1:53")):  # fmt: skip
        try:
            if address is not None:
                split_address(address)
        except ValueError as cause:
            raise typer.BadParameter(f"{cause}; expected {what}", param_hint=flag) from None
    tunnels = running_tunnels()
    if bootstrap is not None and port is None:
        port = split_address(bootstrap)[1]
    state = tunnels.get(port) if port is not None else None
    if state is None and bootstrap is None and len(tunnels) == 1:
        state = next(iter(tunnels.values()))
    status = json.loads(fetch(state["control"], "/status")) if state is not None else None
    if via is None and status is not None:
        via = status.get("via")
    elif via is None and bootstrap is None and shutil.which("kubectl"):
        via = "kubectl"  # what `up` with no flags chooses
    kubectl, start = None, None
    if via == "kubectl":
        kubectl = Kubectl(kubeconfig=kube.kubeconfig, context=kube.context,
                          namespace=kube.namespace)  # fmt: skip
        if status is None and bootstrap is None:  # no tunnel yet: can `up` start?
            forwarder = KubectlForwarder(kubectl, target=kube.target, selector=kube.selector)
            start = StartCheck(forwarder, kube.kafka_port)
    subject = Subject(bootstrap, kubectl=kubectl)
    if status is not None:
        subject = subject_from_status(status, kubectl)
        subject.bootstrap = bootstrap or subject.bootstrap
    resolve = dns_server_resolve(resolver) if resolver else system_resolve
    results = run_checks(subject, resolve, start)
    failed = any(r.status == FAIL for r in results)
    if as_json:
        print(json.dumps({"ok": not failed, "checks": [asdict(r) for r in results]}, indent=2))
        return 1 if failed else 0
    table = Table(title="kafkatunnel doctor", title_justify="left")
    for column in ("check", "result", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for r in results:
        table.add_row(escape(r.check), f"[{STYLE[r.status]}]{r.status}[/]", escape(r.detail),
                      escape(r.fix))  # fmt: skip
    console.print(table)
    console.print("[green]all checks passed[/]" if not failed else "[red]some checks failed[/]")
    return 1 if failed else 0
