"""`kafkatunnel dns setup` and `dns teardown`: the resolver set-up for a tunnel that is
already running, and its undoing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import typer
from rich.console import Console

from kafkatunnel.cli.options import port_option
from kafkatunnel.cli.output import error, make_console
from kafkatunnel.hostnames import split_address
from kafkatunnel.tunnel.control import fetch, running_tunnels

app = typer.Typer(help="Point this machine's resolver at a running tunnel's DNS shim.")


@app.command("setup")
def dns_setup(
    method: str = typer.Option(
        "auto", metavar="METHOD", help="auto, systemd-resolved, resolver-dir or hosts."
    ),
    port: int | None = port_option(),
    dry_run: bool = typer.Option(False, help="Print what would be done, change nothing."),
    hosts_file: str = typer.Option("/etc/hosts", metavar="FILE", help="For --method hosts."),
    resolver_dir: str = typer.Option(
        "/etc/resolver", metavar="DIR", help="For --method resolver-dir (macOS)."
    ),
    apply: bool = typer.Option(False, help="macOS: also add the lo0 aliases (runs sudo)."),
) -> None:
    """Route the cluster's names to the running tunnel's DNS shim (undo: dns teardown)."""
    run_dns_setup(make_console(), method, port, dry_run, hosts_file, resolver_dir, apply)


@app.command("teardown")
def dns_teardown(
    dry_run: bool = typer.Option(False, help="Print what would be undone, change nothing."),
) -> None:
    """Undo everything `dns setup` (or `up --dns`) did, also after a crash."""
    from kafkatunnel.dns.resolver import teardown

    console = make_console()
    steps = teardown(dry_run=dry_run)
    for step in steps or ["nothing to undo"]:
        console.print(("would " if dry_run else "") + step)


def run_dns_setup(
    console: Console,
    method: str,
    port: int | None,
    dry_run: bool,
    hosts_file: str,
    resolver_dir: str,
    apply: bool,
) -> None:
    from kafkatunnel.dns.resolver import loopback_alias_commands, setup

    tunnels = running_tunnels()
    if port is not None:
        tunnels = {p: s for p, s in tunnels.items() if p == port}
    if len(tunnels) != 1:
        found = ", ".join(str(p) for p in tunnels) or "none"
        error(f"need exactly one running tunnel (found: {found})",
              "start one with `kafkatunnel up --dns`, or pick one with --port")  # fmt: skip
        raise typer.Exit(2)
    status = json.loads(fetch(next(iter(tunnels.values()))["control"], "/status"))
    dns = status.get("dns")
    if not dns:
        error("that tunnel has no DNS shim", "start it with `kafkatunnel up --dns`")
        raise typer.Exit(2)
    aliases = loopback_alias_commands(sorted(set(dns["names"].values())))
    for command in aliases:
        console.print(("run: " if not apply else "") + command)
        if apply and not dry_run:
            done = subprocess.run(command.split(), capture_output=True, text=True)
            if done.returncode != 0:
                error(f"`{command}` exited with {done.returncode}: {done.stderr.strip()}",
                      "run it by hand (it needs sudo), then `kafkatunnel dns setup`")  # fmt: skip
                raise typer.Exit(2)
    try:
        plan = setup(
            method=method,
            names=dns["names"],
            domains=dns.get("zones", dns["domains"]),
            server=split_address(dns["listen"]),
            hosts_file=Path(hosts_file),
            resolver_dir=Path(resolver_dir),
            dry_run=dry_run,
        )
    except (ValueError, RuntimeError, OSError) as cause:
        error(str(cause))
        raise typer.Exit(2) from None
    for note in plan.notes:
        console.print(f"note: {note}", highlight=False)
    for step in plan.steps:
        console.print(f"{'would ' if dry_run else ''}{plan.method}: {step}", highlight=False)
