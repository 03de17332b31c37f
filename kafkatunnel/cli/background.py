"""`kafkatunnel up --detach` and `kafkatunnel down`: a tunnel that outlives its shell.

--detach starts the very same `up` command as a new session in the background (its output
in a log file next to the tunnel's state file), waits until it serves, and prints where it
is. `down` asks running tunnels to stop (SIGTERM: listeners and forwards close cleanly) and
waits until they are gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from kafkatunnel.cli.options import port_option
from kafkatunnel.cli.output import error, make_console
from kafkatunnel.files import create_private, state_dir, state_directory
from kafkatunnel.pids import die_with_parent, ours, pid_alive
from kafkatunnel.tunnel.control import ControlError, fetch, running_tunnels

START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


def running_or_exit(console: Console, port: int | None) -> dict[int, dict[str, Any]]:
    """The running tunnels (the one on `port`, if given), or exit 1 saying there is none."""
    tunnels = running_tunnels()
    if port is not None:
        tunnels = {p: s for p, s in tunnels.items() if p == port}
    if not tunnels:
        where = f" on port {port}" if port is not None else ""
        error(f"no running tunnel{where}", "start one with `kafkatunnel up`")
        raise typer.Exit(1)
    return tunnels


@dataclass
class Started:
    """A tunnel started in the background, serving: its process, its /status, its log."""

    process: subprocess.Popen[bytes]
    status: dict[str, Any]
    log: Path


def start_in_background(args: list[str], *, with_parent: bool = False) -> Started:
    """`kafkatunnel ARGS` (an `up` command line) as a new session, its output in a log file
    beside the tunnel's state file, once it serves; or exit 2 with what it said.
    `with_parent`: the kernel ends it when this process dies (`run`), not only on `down`."""
    directory = state_directory(state_dir())
    log = directory / f"up-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
    with os.fdopen(create_private(log), "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "kafkatunnel", *args],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=_session_with_parent if with_parent else os.setsid,
            env={**os.environ, "KAFKATUNNEL_DETACH": "0"},  # not again, whatever the profile
        )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            error(f"the tunnel exited ({process.returncode}) at start:\n{log.read_text().strip()}")
            log.unlink(missing_ok=True)
            raise typer.Exit(2)
        mine = [s for s in running_tunnels().values() if s.get("pid") == process.pid]
        if mine:
            with contextlib.suppress(OSError):  # its control socket a moment after the file
                status = json.loads(fetch(mine[0]["control"], "/status"))
                if status.get("started", True):  # done asking the cluster what it wants
                    return Started(process, status, log)
        time.sleep(0.1)
    process.terminate()
    error(f"the tunnel did not start within {START_TIMEOUT:g}s", f"see its log: {log}")
    raise typer.Exit(2)


def _session_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    die_with_parent()


def detach(console: Console, argv: list[str]) -> None:
    args = [a for a in argv if a not in ("--detach", "-d")] + ["--no-table"]
    started = start_in_background(args)
    print(f"bootstrap.servers={started.status['bootstrap_servers']}", flush=True)
    console.print(
        f"tunnel running in the background: pid {started.process.pid}, log {started.log}; "
        "`kafkatunnel status` shows it, `kafkatunnel down` stops it",
        highlight=False,
    )


def down(
    port: int | None = port_option(),
    everything: bool = typer.Option(False, "--all", help="Stop every running tunnel."),
    clean: bool = typer.Option(
        False,
        "--clean",
        help="First delete the groups an isolating tunnel's clients used (up --isolate): "
        "their GROUP.SUFFIX on the cluster, never another.",
    ),
) -> None:
    """Stop a tunnel running in the background (or in another shell)."""
    console = make_console()
    tunnels = running_or_exit(console, port)
    if len(tunnels) > 1 and not everything:
        ports = ", ".join(str(p) for p in sorted(tunnels))
        error(f"{len(tunnels)} tunnels run (ports {ports})",
              "choose one with --port PORT, or stop them all with --all")  # fmt: skip
        raise typer.Exit(2)
    for tunnel_port, state in sorted(tunnels.items()):
        pid = int(state["pid"])
        if not ours(pid):
            stale = state_dir() / f"tunnel-{tunnel_port}.json"
            error(f"the tunnel state file for port {tunnel_port} names pid {pid}, which is "
                  "not a kafkatunnel process of yours: left alone",
                  f"remove {stale} if it is stale")  # fmt: skip
            continue
        if clean and not _cleaned(console, tunnel_port, state):
            raise typer.Exit(1)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            console.print(f"tunnel on port {tunnel_port} (pid {pid}) did not stop in "
                          f"{STOP_TIMEOUT:g}s: killed")  # fmt: skip
            Path(state_dir() / f"tunnel-{tunnel_port}.json").unlink(missing_ok=True)
        else:
            console.print(f"tunnel on port {tunnel_port} (pid {pid}) stopped")


def _cleaned(console: Console, port: int, state: dict[str, Any]) -> bool:
    """`down --clean` of one tunnel: its isolated groups deleted, said group by group;
    False (the tunnel left running, to try again) when one could not be."""
    from kafkatunnel.isolated_groups import CleanError, delete_isolated_groups
    from kafkatunnel.protocol import one_line

    try:
        status = json.loads(fetch(state["control"], "/status"))
        cleaned = delete_isolated_groups(status)
    except (OSError, ControlError, ValueError) as cause:
        error(f"could not ask the tunnel on port {port} which groups it isolated: {cause}",
              "is it still running? `kafkatunnel status` shows it")  # fmt: skip
        return False
    except CleanError as cause:
        error(f"tunnel on port {port}: {cause}")
        return False
    for name in cleaned.deleted:
        console.print(f"deleted group {one_line(name)}.{cleaned.suffix}", highlight=False)
    if cleaned.absent:
        names = ", ".join(f"{one_line(n)}.{cleaned.suffix}" for n in cleaned.absent)
        console.print(f"not on the cluster (never made, or deleted before): {names}",
                      highlight=False)  # fmt: skip
    for name, why in cleaned.failed.items():
        error(f"group {one_line(name)}.{cleaned.suffix} was not deleted: {why}")
    if not (cleaned.deleted or cleaned.absent or cleaned.failed):
        console.print(f"tunnel on port {port}: its clients used no group", highlight=False)
    return not cleaned.failed
