"""The running tunnel's control endpoint: a loopback-only HTTP server answering
`GET /status` (JSON) and `GET /metrics` (Prometheus text), found by other commands through a
state file named after the tunnel's bootstrap port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kafkatunnel.pids import pid_alive


def state_dir() -> Path:
    explicit = os.environ.get("KAFKATUNNEL_STATE_DIR")
    if explicit:
        return Path(explicit)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "kafkatunnel" if runtime else Path.home() / ".kafkatunnel" / "run"


class ControlServer:
    def __init__(
        self,
        status: Callable[[], dict[str, Any]],
        metrics: Callable[[], str],
        tunnel_port: int,
        port: int = 0,
    ) -> None:
        self.status = status
        self.metrics = metrics
        self.tunnel_port = tunnel_port
        self.port = port
        self.server: asyncio.Server | None = None
        self.state_file = state_dir() / f"tunnel-{tunnel_port}.json"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(
            json.dumps({"pid": os.getpid(), "control": f"127.0.0.1:{self.port}"})
        )

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            if json.loads(self.state_file.read_text()).get("pid") == os.getpid():
                self.state_file.unlink()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            parts = request.decode(errors="replace").split()
            path = parts[1] if len(parts) >= 2 else ""
            if path == "/status":
                body, kind, code = json.dumps(self.status()).encode(), "application/json", 200
            elif path == "/metrics":
                body, kind, code = self.metrics().encode(), "text/plain; version=0.0.4", 200
            else:
                body, kind, code = b"try /status or /metrics\n", "text/plain", 404
            head = (
                f"HTTP/1.0 {code} OK\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
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


def fetch(control: str, path: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(f"http://{control}{path}", timeout=timeout) as answer:
        return str(answer.read().decode())
