"""Pointing the system's resolver at the shim, reversibly.

Three methods: systemd-resolved (per-link domain routing with `resolvectl`), macOS
`/etc/resolver/<domain>` files, and a managed block in /etc/hosts as the fallback. Each
action is written to a state file before it is taken, so `teardown` undoes everything that
was set up, also after a crash, and leaves every file as it was, byte for byte.

systemd-resolved refuses per-link DNS on a loopback link ("Link lo is loopback device":
its link bus methods check the link's flags first), and only routes to a link it finds
relevant: up, with carrier and a non-loopback address. So the shim gets a link of its own,
as VPN tools do: a dummy interface `kafkatunnel0` with a link-local address, its DNS server
the shim, its routing domains the cluster's zones (short forms included), and never the
default route. Where the kernel has no dummy driver (some containers) a veth pair serves.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafkatunnel.files import inside, replace_system_file, state_dir, state_directory, write_whole
from kafkatunnel.hostnames import UntrustedName, check_host, is_ip_literal

BEGIN = "# BEGIN kafkatunnel (managed: `kafkatunnel dns teardown` removes this block)"
END = "# END kafkatunnel"
METHODS = ("auto", "systemd-resolved", "resolver-dir", "hosts")
LINK = "kafkatunnel0"
LINK_ADDRESS = "169.254.53.53/32"  # makes the link relevant to resolved; nothing routes to it
LINK_WAIT = 5.0  # seconds for resolved to learn of the new link


class ResolverError(RuntimeError):
    """A set-up command failed; the message has its own output and the fix."""


@dataclass
class Plan:
    """What setup will do: the commands it runs and the files it writes."""

    method: str
    steps: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. why another method was used


def state_file() -> Path:
    return state_dir() / "dns-setup.json"


def choose_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"--method {method!r} is not one of {', '.join(METHODS)}")
    if method != "auto":
        return method
    if sys.platform == "darwin":
        return "resolver-dir"
    if shutil.which("resolvectl") and _resolved_active():
        return "systemd-resolved"
    return "hosts"


def _resolved_active() -> bool:
    """Whether systemd-resolved answers on D-Bus (systemctl may not exist, e.g. in WSL or a
    container, while resolved runs)."""
    try:
        result = subprocess.run(["resolvectl", "--no-pager", "status"], capture_output=True,
                                text=True, timeout=5)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _run(command: list[str]) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ResolverError(f"`{' '.join(command)}` could not run: {error}") from None
    if result.returncode != 0:
        output = (result.stderr.strip() or result.stdout.strip() or "no output").replace("\n", "; ")
        raise ResolverError(f"`{' '.join(command)}` exited with {result.returncode}: {output}")


def _link_commands(kind: str) -> list[list[str]]:
    if kind == "dummy":
        create = ["ip", "link", "add", LINK, "type", "dummy"]
        up = [["ip", "link", "set", LINK, "up"]]
    else:
        create = ["ip", "link", "add", LINK, "type", "veth", "peer", "name", f"{LINK}p"]
        up = [["ip", "link", "set", LINK, "up"], ["ip", "link", "set", f"{LINK}p", "up"]]
    return [create, *up, ["ip", "address", "add", LINK_ADDRESS, "dev", LINK]]


def _resolvectl_commands(domains: list[str], server: tuple[str, int]) -> list[list[str]]:
    address = server[0] if server[1] == 53 else f"{server[0]}:{server[1]}"
    return [
        ["resolvectl", "dns", LINK, address],
        ["resolvectl", "domain", LINK, *[f"~{d}" for d in domains]],
        ["resolvectl", "default-route", LINK, "false"],
    ]


def _setup_resolved(domains: list[str], server: tuple[str, int]) -> str:
    """Create the link and point resolved at the shim through it; returns the link kind.
    Whatever fails is undone before ResolverError says why."""
    try:
        _run(_link_commands("dummy")[0])
        kind = "dummy"
    except ResolverError as error:
        if "Unknown device type" not in str(error):
            raise
        kind = "veth"  # no dummy driver in this kernel
        _run(_link_commands(kind)[0])
    try:
        for command in _link_commands(kind)[1:]:
            _run(command)
        dns, *rest = _resolvectl_commands(domains, server)
        deadline = time.monotonic() + LINK_WAIT
        while True:  # resolved learns of new links from netlink, a moment later
            try:
                _run(dns)
                break
            except ResolverError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        for command in rest:
            _run(command)
    except ResolverError:
        _undo_resolved(LINK)
        raise
    return kind


def _undo_resolved(link: str) -> None:
    subprocess.run(["resolvectl", "revert", link], capture_output=True)
    subprocess.run(["ip", "link", "del", link], capture_output=True)


def _load() -> list[dict[str, Any]]:
    path = state_file()
    return json.loads(path.read_text()) if path.exists() else []


def _record(actions: list[dict[str, Any]]) -> None:
    """The journal of set-up actions, written whole before each action is taken."""
    path = state_file()
    state_directory(path.parent)
    write_whole(path, json.dumps(actions, indent=1).encode())


def _checked(names: dict[str, str], domains: list[str]) -> None:
    """Names reach the machine's resolution only as plain host names (no newline can add
    a line to /etc/hosts, no slash can leave /etc/resolver): the tunnel checked them
    already; this is the last gate before the system's files."""
    for name in [*names, *domains]:
        check_host(name)
    for address in names.values():
        if not is_ip_literal(address):
            raise UntrustedName(f"{address!r} is not an IP address")


def hosts_block(names: dict[str, str]) -> str:
    by_address: dict[str, list[str]] = {}
    for name, address in sorted(names.items()):
        by_address.setdefault(address, []).append(name)
    lines = [f"{address} {' '.join(hosts)}" for address, hosts in sorted(by_address.items())]
    return "\n".join([BEGIN, *lines, END]) + "\n"


def setup(
    *,
    method: str,
    names: dict[str, str],
    domains: list[str],
    server: tuple[str, int],
    hosts_file: Path = Path("/etc/hosts"),
    resolver_dir: Path = Path("/etc/resolver"),
    dry_run: bool = False,
) -> Plan:
    """Point the resolver at the shim (or, for `hosts`, write the names themselves)."""
    chosen = choose_method(method)
    _checked(names, domains)
    plan = Plan(chosen)
    actions = _load()
    if chosen == "hosts":
        plan.steps.append(f"append a managed block of {len(names)} names to {hosts_file}")
        if not dry_run:
            original = hosts_file.read_bytes() if hosts_file.exists() else b""
            if BEGIN.encode() in original:
                raise RuntimeError(
                    f"{hosts_file} already has a kafkatunnel block: run `kafkatunnel dns teardown`"
                )
            newline = bool(original) and not original.endswith(b"\n")
            block = hosts_block(names)
            actions.append(
                {"kind": "hosts", "file": str(hosts_file), "block": block, "newline": newline}
            )
            _record(actions)
            replace_system_file(hosts_file, original + (b"\n" if newline else b"") + block.encode())
    elif chosen == "resolver-dir":
        for domain in domains:
            target = inside(resolver_dir, domain.rstrip("."))
            plan.steps.append(f"write {target}: nameserver {server[0]} port {server[1]}")
            if dry_run:
                continue
            backup = target.read_bytes().hex() if target.exists() else None
            actions.append({"kind": "resolver-file", "file": str(target), "backup": backup})
            _record(actions)
            resolver_dir.mkdir(parents=True, exist_ok=True)
            write_whole(target, f"nameserver {server[0]}\nport {server[1]}\n".encode(), 0o644)
    else:
        for command in _link_commands("dummy") + _resolvectl_commands(domains, server):
            plan.steps.append(" ".join(command))
        if not dry_run:
            actions.append({"kind": "resolved-link", "link": LINK})
            _record(actions)
            try:
                _setup_resolved(domains, server)
            except ResolverError as error:
                _record(actions[:-1])
                if method != "auto":
                    raise ResolverError(
                        f"{error}\nfix: run as root (the shim needs a network link of its "
                        "own), or choose another way: --dns-setup hosts"
                    ) from None
                fallback = setup(method="hosts", names=names, domains=domains, server=server,
                                 hosts_file=hosts_file, dry_run=dry_run)  # fmt: skip
                fallback.notes.append(f"systemd-resolved did not take it ({error}): used hosts")
                return fallback
    return plan


def teardown(*, dry_run: bool = False) -> list[str]:
    """Undo every recorded set-up action, newest first; returns what was (or would be) done."""
    done = []
    actions = _load()
    for action in reversed(actions):
        kind = action["kind"]
        if kind == "hosts":
            path = Path(action["file"])
            done.append(f"remove the managed block from {path}")
            if not dry_run and path.exists():
                content = path.read_bytes()
                block = (b"\n" if action["newline"] else b"") + action["block"].encode()
                if block in content:
                    replace_system_file(path, content.replace(block, b"", 1))
        elif kind == "resolver-file":
            path = Path(action["file"])
            if action["backup"] is None:
                done.append(f"remove {path}")
                if not dry_run:
                    path.unlink(missing_ok=True)
            else:
                done.append(f"restore {path}")
                if not dry_run:
                    write_whole(path, bytes.fromhex(action["backup"]), 0o644)
        elif kind == "resolvectl":  # set up by an older kafkatunnel: settings on a link
            done.append(f"resolvectl revert {action['link']}")
            if not dry_run:
                subprocess.run(["resolvectl", "revert", action["link"]], capture_output=True)
        elif kind == "resolved-link":
            done.append(f"resolvectl revert {action['link']}; ip link del {action['link']}")
            if not dry_run:
                _undo_resolved(action["link"])
    if not dry_run:
        state_file().unlink(missing_ok=True)
    return done


def loopback_alias_commands(addresses: list[str], platform: str = sys.platform) -> list[str]:
    """On macOS only 127.0.0.1 exists on lo0 until aliased; Linux routes all of 127/8."""
    if platform != "darwin":
        return []
    return [f"sudo ifconfig lo0 alias {address} up" for address in addresses]
