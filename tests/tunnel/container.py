"""A container as Docker makes one on Linux, without Docker: its own network namespace,
joined by a veth pair to a bridge on the host (as docker0) that holds HOST_ADDRESS on a
link-local /30, and its own /etc/hosts naming the host `host.docker.internal` (as Docker's
`host-gateway` does). Each worker of a parallel run has a /30 of its own: two bridges
holding one address would take each other's traffic."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

from kafkatunnel.demo.netns import NetworkNamespace

_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
HOST_ADDRESS = f"169.254.{99 + _WORKER}.1"
CONTAINER_ADDRESS = f"169.254.{99 + _WORKER}.2"
HOST_NAME = "host.docker.internal"
_serial = itertools.count()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Container:
    def __enter__(self) -> Container:
        self.namespace = NetworkNamespace(hosts={HOST_NAME: HOST_ADDRESS})
        number = f"{os.getpid() % 10000}{next(_serial)}"
        self.bridge, self.host_side, inside = (f"kt-br{number}", f"kt-vh{number}",
                                               f"kt-vc{number}")  # fmt: skip
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "add", self.host_side, "type", "veth", "peer", "name", inside)
            _ip("link", "set", self.host_side, "master", self.bridge)
            _ip("link", "set", inside, "netns", self.namespace.name)
            _ip("addr", "add", f"{HOST_ADDRESS}/30", "dev", self.bridge)
            _ip("link", "set", self.host_side, "up")
            _ip("link", "set", self.bridge, "up")
            self.run_ip("addr", "add", f"{CONTAINER_ADDRESS}/30", "dev", inside)
            self.run_ip("link", "set", inside, "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def run_ip(self, *args: str) -> None:
        _ip("netns", "exec", self.namespace.name, "ip", *args)

    def python(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """This interpreter, inside the container, with the project importable."""
        root = str(Path(__file__).resolve().parents[2])
        return subprocess.run(
            [*self.namespace.exec_prefix(), sys.executable, *args],
            capture_output=True, text=True, timeout=timeout, cwd=root,
            env={**os.environ, "PYTHONPATH": root},
        )  # fmt: skip

    def __exit__(self, *exc: object) -> None:
        for link in (self.host_side, self.bridge):
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)
        self.namespace.close()
