"""Capturing a real interface with Wireshark's dumpcap, as a team would with tcpdump: for
recordings of traffic that did not pass through the tunnel (the single-forward control)."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

from kafkatunnel.waiting import wait_for


class Dumpcap:
    def __init__(self, path: Path, ports: list[int], interface: str = "lo") -> None:
        if shutil.which("dumpcap") is None:
            raise RuntimeError("dumpcap is not installed (Debian: apt-get install tshark)")
        self.path = path
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
        return self

    def stop(self) -> None:
        if self._process is None:
            return
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
