"""Pointing the system's resolver at the shim, reversibly.

Three methods: systemd-resolved (per-link domain routing with `resolvectl`), macOS
`/etc/resolver/<domain>` files, and a managed block in /etc/hosts as the fallback. Each
action is written to a state file before it is taken, so `teardown` undoes everything that
was set up, also after a crash, and leaves every file as it was, byte for byte.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafkatunnel.tunnel.control import state_dir

BEGIN = "# BEGIN kafkatunnel (managed: `kafkatunnel dns teardown` removes this block)"
END = "# END kafkatunnel"
METHODS = ("auto", "systemd-resolved", "resolver-dir", "hosts")


@dataclass
class Plan:
    """What setup will do: the commands it runs and the files it writes."""

    method: str
    steps: list[str] = field(default_factory=list)


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
    result = subprocess.run(
        ["systemctl", "is-active", "systemd-resolved"], capture_output=True, text=True
    )
    return result.stdout.strip() == "active"


def _load() -> list[dict[str, Any]]:
    path = state_file()
    return json.loads(path.read_text()) if path.exists() else []


def _record(actions: list[dict[str, Any]]) -> None:
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(actions, indent=1))


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
    link: str = "lo",
    dry_run: bool = False,
) -> Plan:
    """Point the resolver at the shim (or, for `hosts`, write the names themselves)."""
    chosen = choose_method(method)
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
            hosts_file.write_bytes(original + (b"\n" if newline else b"") + block.encode())
    elif chosen == "resolver-dir":
        for domain in domains:
            target = resolver_dir / domain
            plan.steps.append(f"write {target}: nameserver {server[0]} port {server[1]}")
            if dry_run:
                continue
            backup = target.read_bytes().hex() if target.exists() else None
            actions.append({"kind": "resolver-file", "file": str(target), "backup": backup})
            _record(actions)
            resolver_dir.mkdir(parents=True, exist_ok=True)
            target.write_text(f"nameserver {server[0]}\nport {server[1]}\n")
    else:
        address = server[0] if server[1] == 53 else f"{server[0]}:{server[1]}"
        commands = [
            ["resolvectl", "dns", link, address],
            ["resolvectl", "domain", link, *[f"~{d}" for d in domains]],
        ]
        for command in commands:
            plan.steps.append(" ".join(command))
        if not dry_run:
            actions.append({"kind": "resolvectl", "link": link})
            _record(actions)
            for command in commands:
                subprocess.run(command, check=True, capture_output=True, text=True)
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
                    path.write_bytes(content.replace(block, b"", 1))
        elif kind == "resolver-file":
            path = Path(action["file"])
            if action["backup"] is None:
                done.append(f"remove {path}")
                if not dry_run:
                    path.unlink(missing_ok=True)
            else:
                done.append(f"restore {path}")
                if not dry_run:
                    path.write_bytes(bytes.fromhex(action["backup"]))
        elif kind == "resolvectl":
            done.append(f"resolvectl revert {action['link']}")
            if not dry_run:
                subprocess.run(["resolvectl", "revert", action["link"]], capture_output=True)
    if not dry_run:
        state_file().unlink(missing_ok=True)
    return done


def loopback_alias_commands(addresses: list[str], platform: str = sys.platform) -> list[str]:
    """On macOS only 127.0.0.1 exists on lo0 until aliased; Linux routes all of 127/8."""
    if platform != "darwin":
        return []
    return [f"sudo ifconfig lo0 alias {address} up" for address in addresses]
