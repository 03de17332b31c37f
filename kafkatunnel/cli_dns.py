"""`kafkatunnel dns setup`: the resolver set-up for a tunnel that is already running."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import typer
from rich.console import Console

from kafkatunnel.dns.resolver import loopback_alias_commands, setup
from kafkatunnel.probe import split_address
from kafkatunnel.tunnel.control import fetch, running_tunnels


def run_dns_setup(
    console: Console,
    method: str,
    port: int | None,
    dry_run: bool,
    hosts_file: str,
    resolver_dir: str,
    apply: bool,
) -> None:
    tunnels = running_tunnels()
    if port is not None:
        tunnels = {p: s for p, s in tunnels.items() if p == port}
    if len(tunnels) != 1:
        found = ", ".join(str(p) for p in tunnels) or "none"
        console.print(
            f"[red]error:[/] need exactly one running tunnel (found: {found}); "
            "start one with `kafkatunnel up --dns`, or pick one with --port"
        )
        raise typer.Exit(2)
    status = json.loads(fetch(next(iter(tunnels.values()))["control"], "/status"))
    dns = status.get("dns")
    if not dns:
        console.print("[red]error:[/] that tunnel has no DNS shim: start it with `up --dns`")
        raise typer.Exit(2)
    aliases = loopback_alias_commands(sorted(set(dns["names"].values())))
    for command in aliases:
        console.print(("run: " if not apply else "") + command)
        if apply and not dry_run:
            subprocess.run(command.split(), check=True)
    try:
        plan = setup(
            method=method,
            names=dns["names"],
            domains=dns["domains"],
            server=split_address(dns["listen"]),
            hosts_file=Path(hosts_file),
            resolver_dir=Path(resolver_dir),
            dry_run=dry_run,
        )
    except (ValueError, RuntimeError, OSError) as error:
        console.print(f"[red]error:[/] {error}")
        raise typer.Exit(2) from None
    for step in plan.steps:
        console.print(f"{'would ' if dry_run else ''}{plan.method}: {step}")
