"""Capturing a real interface with Wireshark's dumpcap, as a team would with tcpdump: for
recordings of traffic that did not pass through the tunnel (the single-forward control)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from kafkatunnel.waiting import wait_for


class Dumpcap:
    def __init__(self, path: Path, ports: list[int], interface: str = "lo") -> None:
        if shutil.which("dumpcap") is None:
            raise RuntimeError("dumpcap is not installed (Debian: apt-get install tshark)")
        self.path = path
        self.ports = ports
        self.filter = " or ".join(f"tcp port {port}" for port in ports)
        self.interface = interface
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> Dumpcap:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(
            ["dumpcap", "-q", "-i", self.interface, "-f", self.filter, "-w", str(self.path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        process = self._process

        def capturing() -> bool:
            if process.poll() is not None:
                error = process.stderr.read().decode() if process.stderr else ""
                raise RuntimeError(f"dumpcap exited: {error.strip()}")
            return self.path.exists() and self.path.stat().st_size > 0

        wait_for(capturing, timeout=10, what=f"dumpcap writing {self.path}")
        # The file appears before the capture is live (~0.8 s here): knock on a captured
        # port until a packet shows up in the file, so nothing after start() is missed.
        self._caught_up("capturing")
        return self

    def _caught_up(self, what: str) -> None:
        """Knock on a captured port until the knock is in the file: everything captured
        before it is written too."""
        size = self.path.stat().st_size

        def written() -> bool:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.ports[0]), timeout=0.2).close()
            return self.path.stat().st_size > size

        wait_for(written, timeout=10, what=f"dumpcap {what} on {self.interface}")

    def stop(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            # dumpcap drops what it has not read yet when it is stopped: let it catch up.
            with contextlib.suppress(Exception):
                self._caught_up("writing what it captured")
        self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stderr:
            self._process.stderr.close()
        self._process = None

    def __enter__(self) -> Dumpcap:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
