"""The running tunnel's control endpoint: HTTP on a unix socket in the owner's 0700 state
directory, answering `GET /status` (JSON) and `GET /metrics` (Prometheus text), found by
other commands through a state file named after the tunnel's bootstrap port.

Status names brokers, errors and recording paths: only the tunnel's owner may read it (a
loopback TCP port would answer every local user). Prometheus, which scrapes TCP, gets
/metrics alone on a port of its own, and only when asked for (`--metrics-listen`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Callable
from typing import Any

from kafkatunnel.files import state_dir, state_directory, write_whole
from kafkatunnel.hostnames import join_address
from kafkatunnel.pids import pid_alive

UNIX = "unix:"  # a control address that is a socket path


class ControlServer:
    def __init__(
        self,
        status: Callable[[], dict[str, Any]],
        metrics: Callable[[], str],
        tunnel_port: int,
        metrics_listen: tuple[str, int] | None = None,
    ) -> None:
        self.status = status
        self.metrics = metrics
        self.tunnel_port = tunnel_port
        self.metrics_listen = metrics_listen
        self.servers: list[asyncio.Server] = []
        self.state_file = state_dir() / f"tunnel-{tunnel_port}.json"
        self.socket_path = state_dir() / f"tunnel-{tunnel_port}.sock"
        self.metrics_address: str | None = None  # HOST:PORT of /metrics over TCP

    @property
    def address(self) -> str:
        return f"{UNIX}{self.socket_path}"

    async def start(self) -> None:
        state_directory(self.state_file.parent)
        with contextlib.suppress(FileNotFoundError):  # left by a tunnel that was killed
            if self.socket_path.is_socket():
                self.socket_path.unlink()
        old = os.umask(0o177)  # the socket is created 0600, not for a moment wider
        try:
            self.servers.append(
                await asyncio.start_unix_server(self._handle, path=str(self.socket_path))
            )
        finally:
            os.umask(old)
        if self.metrics_listen is not None:
            host, port = self.metrics_listen
            server = await asyncio.start_server(self._handle_metrics, host, port)
            self.metrics_address = join_address(host, server.sockets[0].getsockname()[1])
            self.servers.append(server)
        state = {"pid": os.getpid(), "control": self.address}
        write_whole(self.state_file, json.dumps(state).encode())

    async def stop(self) -> None:
        for server in self.servers:
            server.close()
            await server.wait_closed()
        with contextlib.suppress(FileNotFoundError, ValueError):
            if json.loads(self.state_file.read_text()).get("pid") == os.getpid():
                self.state_file.unlink()
                self.socket_path.unlink(missing_ok=True)

    async def _handle_metrics(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await self._handle(reader, writer, ("/metrics",))

    async def _handle(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        paths: tuple[str, ...] = ("/status", "/metrics"),
    ) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            parts = request.decode(errors="replace").split()
            path = parts[1] if len(parts) >= 2 and parts[1] in paths else ""
            if path == "/status":
                body, kind, code = json.dumps(self.status()).encode(), "application/json", 200
            elif path == "/metrics":
                body, kind, code = self.metrics().encode(), "text/plain; version=0.0.4", 200
            else:
                body, kind, code = f"try {' or '.join(paths)}\n".encode(), "text/plain", 404
            head = (
                f"HTTP/1.0 {code} OK\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError):  # ValueError: a line past 64 KiB
            pass
        finally:
            writer.close()


def running_tunnels() -> dict[int, dict[str, Any]]:
    """Tunnel port -> state, for every tunnel whose process is alive (stale files removed)."""
    found = {}
    directory = state_dir()
    for path in sorted(directory.glob("tunnel-*.json")) if directory.exists() else []:
        try:
            state = json.loads(path.read_text())
            port = int(path.stem.split("-", 1)[1])
        except (ValueError, OSError):
            continue
        if pid_alive(int(state.get("pid", 0))):
            found[port] = state
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return found


class ControlError(OSError):
    """The control endpoint did not answer as a running tunnel does."""


def fetch(control: str, path: str, timeout: float = 5.0) -> str:
    """GET `path` from a tunnel's control address (`unix:/path/to.sock`)."""
    if not control.startswith(UNIX):
        raise ControlError(f"{control!r} is not a control socket (a tunnel older than this one?)")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(control[len(UNIX) :])
        sock.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        answer = bytearray()
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = bytes(answer).partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.0 200"):
        raise ControlError(f"the tunnel's control socket answered {head[:40]!r} for {path}")
    return body.decode()
