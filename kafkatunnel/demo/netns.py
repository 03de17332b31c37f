"""Linux network namespaces: the stand-in for a Kubernetes pod network.

A namespace has its own loopback, so a broker listening on 127.0.0.1 inside it cannot be
reached from the host, exactly as a pod's address cannot be reached from a laptop.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path

from kafkatunnel.pids import pid_alive

CLONE_NEWNET = 0x40000000
NAME_PREFIX = "kt-"
NETNS_RUN_DIR = Path("/var/run/netns")
NETNS_ETC_DIR = Path("/etc/netns")


class IsolationUnavailable(RuntimeError):
    """Network namespaces cannot be used here (not root, or no `ip netns`)."""


def isolation_problem() -> str | None:
    """Why namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "not running as root (ip netns needs root)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns list` failed: {probe.stderr.strip()}"
    return None


def _run(*args: str) -> None:
    result = subprocess.run(list(args), capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed: {result.stderr.strip()}")


def namespace_pids(name: str) -> list[int]:
    result = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []


def list_harness_namespaces() -> list[str]:
    result = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    names = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(NAME_PREFIX)]


def remove_namespace(name: str) -> None:
    """Kill every process inside `name`, then delete it and its /etc/netns files."""
    for pid in namespace_pids(name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    shutil.rmtree(NETNS_ETC_DIR / name, ignore_errors=True)


def remove_stale_namespaces() -> list[str]:
    """Delete namespaces left by a harness whose process died (name: kt-<pid>-<n>)."""
    removed = []
    for name in list_harness_namespaces():
        parts = name.split("-")
        owner = int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None
        if owner is not None and owner != os.getpid() and not pid_alive(owner):
            remove_namespace(name)
            removed.append(name)
    return removed


INSIDE_PORTS = "61000 65499"  # the namespace's ephemeral ports (ip_local_port_range)


class NetworkNamespace:
    """A namespace with its loopback up and an optional hosts file, removed on close."""

    _counter = 0
    _lock = threading.Lock()

    def __init__(self, hosts: dict[str, str] | None = None, resolv_conf: str | None = None) -> None:
        problem = isolation_problem()
        if problem:
            raise IsolationUnavailable(problem)
        with NetworkNamespace._lock:
            NetworkNamespace._counter += 1
            self.name = f"{NAME_PREFIX}{os.getpid()}-{NetworkNamespace._counter}"
        remove_stale_namespaces()
        _run("ip", "netns", "add", self.name)
        try:
            _run("ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up")
            # Ports chosen inside (a mock broker's) come from above the host's own ephemeral
            # range (32768-60999 by default): a host connection that happens to hold the same
            # local port would stop a host listener of that number (a single forward's).
            _run("ip", "netns", "exec", self.name, "sh", "-c",
                 f"echo '{INSIDE_PORTS}' > /proc/sys/net/ipv4/ip_local_port_range")  # fmt: skip
            # `ip netns exec` bind-mounts /etc/netns/<name>/* over /etc/*: the namespace's
            # own name resolution, as a pod's cluster DNS or a laptop's resolver would give.
            etc = NETNS_ETC_DIR / self.name
            if hosts:
                etc.mkdir(parents=True, exist_ok=True)
                lines = ["127.0.0.1 localhost"] + [f"{ip} {host}" for host, ip in hosts.items()]
                (etc / "hosts").write_text("\n".join(lines) + "\n")
            if resolv_conf is not None:
                etc.mkdir(parents=True, exist_ok=True)
                (etc / "resolv.conf").write_text(resolv_conf)
        except BaseException:
            remove_namespace(self.name)
            raise

    def exec_prefix(self) -> list[str]:
        """The argv prefix that runs a command inside this namespace."""
        return ["ip", "netns", "exec", self.name]

    def connect(self, host: str, port: int, timeout: float = 2.0) -> socket.socket:
        """A TCP socket connected from inside the namespace, usable from any thread.

        A socket belongs to the namespace it was created in, so a throw-away thread enters
        the namespace with setns(2), creates and connects the socket, and hands it back.
        """
        result: list[socket.socket | BaseException] = []

        def enter_and_connect() -> None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                with open(NETNS_RUN_DIR / self.name) as ns:
                    if libc.setns(ns.fileno(), CLONE_NEWNET) != 0:
                        err = ctypes.get_errno()
                        raise OSError(err, f"setns into {self.name}: {os.strerror(err)}")
                result.append(socket.create_connection((host, port), timeout=timeout))
            except BaseException as error:
                result.append(error)

        thread = threading.Thread(target=enter_and_connect, name=f"setns-{self.name}")
        thread.start()
        thread.join()
        outcome = result[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def close(self) -> None:
        remove_namespace(self.name)

    def __enter__(self) -> NetworkNamespace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
