"""Listening sockets: bound at once (clients may queue before the loop accepts), and an
Acceptor that hands each connection over as a plain non-blocking socket, for the relay to
drive by its descriptor."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

from kafkatunnel.hostnames import join_address

log = logging.getLogger("kafkatunnel.listeners")
ACCEPT_BURST = 64  # connections taken per wake-up
BACKOFF = 1.0  # seconds without accepting after running out of descriptors


class PortInUse(RuntimeError):
    """A listener's port is taken; the message names the port and the flag that changes it."""


def bind_listener(host: str, port: int, flag: str) -> socket.socket:
    """A listening socket, bound now (so clients can queue at once), or PortInUse."""
    if not 0 < port < 65536:
        raise PortInUse(f"port {port} is not between 1 and 65535; see {flag}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            holder = holder_of(port)
            by = f" by {holder}" if holder else " (another tunnel, or a `kubectl port-forward`?)"
            raise PortInUse(
                f"port {port} on {host} is already in use{by}; choose another with {flag}"
            ) from None
        raise PortInUse(f"cannot listen on {host}:{port}: {error.strerror}; see {flag}") from None
    sock.listen(512)
    sock.setblocking(False)
    return sock


def holder_of(port: int, proc: Path = Path("/proc")) -> str | None:
    """`NAME (pid N)` of a process listening on TCP `port`, when /proc shows it (Linux;
    other users' processes only to root), else None."""
    inodes = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if (
                len(fields) > 9
                and fields[3] == LISTEN
                and int(fields[1].rpartition(":")[2], 16) == port
            ):
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    name = (entry / "comm").read_text().strip()
                    return f"{name} (pid {entry.name})"
        except OSError:
            continue
    return None


LISTEN = "0A"  # the TCP state column of /proc/net/tcp


class Acceptor:
    """Accepts on a bound listening socket and passes each connection on."""

    def __init__(self, sock: socket.socket, on_connection: Callable[[socket.socket], None]) -> None:
        self.sock = sock
        self.on_connection = on_connection
        self.loop = asyncio.get_running_loop()
        self._watching = False
        self._closed = False

    def start(self) -> None:
        if not self._closed and not self._watching:
            self.loop.add_reader(self.sock.fileno(), self._accept)
            self._watching = True

    def _accept(self) -> None:
        for _ in range(ACCEPT_BURST):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as error:  # out of descriptors: pause rather than spin
                log.warning(
                    "%s: cannot accept (%s); retrying in %gs (raise `ulimit -n`?)",
                    self.address, error.strerror, BACKOFF,
                )  # fmt: skip
                self._unwatch()
                self.loop.call_later(BACKOFF, self.start)
                return
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.on_connection(conn)

    @property
    def address(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return join_address(host, port)

    def _unwatch(self) -> None:
        if self._watching:
            self.loop.remove_reader(self.sock.fileno())
            self._watching = False

    def close(self) -> None:
        self._unwatch()
        if not self._closed:
            self._closed = True
            self.sock.close()


_SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's IPv4 address


def address_of(interface: str) -> str | None:
    """An interface's IPv4 address (None: it has none, or this is not Linux)."""
    import fcntl
    import struct

    request = struct.pack("256s", interface.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
        except OSError:
            return None
    return socket.inet_ntoa(answer[20:24])


def interface_of(address: str) -> str | None:
    """The network interface that holds an IPv4 address on this machine (None: none here,
    or not Linux): what can reach a listener on it is what can reach that interface."""
    if not hasattr(socket, "if_nameindex"):
        return None
    return next((name for _, name in socket.if_nameindex() if address_of(name) == address), None)
