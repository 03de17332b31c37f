"""Docker for the container tests: the machine's engine when `docker info` answers, else
Debian's engine that scripts/test unpacked beside the virtualenv, started here on a socket
of its own for this package's tests and stopped when they end, with the bridges it made.
The image is the Debian root file system scripts/test made with debootstrap, imported: no
image registry is asked for anything."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kafkatunnel.demo import isolation_problem
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.waiting import wait_for
from tests.worlds.private_mounts import PrivateMounts

ROOT = Path(__file__).resolve().parents[2]
ENGINE = Path(sys.prefix) / "opt/docker-engine"
ROOTFS = Path.home() / ".cache/kafkatunnel/images/debian-minbase.tar"
DEVCONTAINER = Path.home() / ".cache/kafkatunnel/devcontainers-cli-0.89.0/node_modules/.bin"
IMAGE = "kafkatunnel-tests/debian:minbase"


@dataclass(frozen=True)
class Docker:
    env: dict[str, str]  # in which `docker` reaches the engine
    image: str

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", *args], capture_output=True, text=True, env=self.env,
                              timeout=timeout)  # fmt: skip

    def shared(self) -> list[Path]:
        """What a container mounts, read-only, to run this checkout's Python and its
        clients: the interpreter, the virtualenv, the checkout."""
        places = {Path(sys.base_prefix).resolve(), Path(sys.prefix), ROOT}
        return sorted(p for p in places if not any(p != o and p.is_relative_to(o) for o in places))

    def volumes(self) -> list[str]:
        return [f"{p}:{p}:ro" for p in self.shared()]


def answers(env: dict[str, str]) -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, env=env,
                              timeout=30).returncode == 0  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="package")
def docker() -> Iterator[Docker]:
    problem = isolation_problem()
    if problem:
        pytest.skip(f"Docker's engine needs root: {problem}")
    env = dict(os.environ)
    engine, mounts = None, None
    interfaces = set(os.listdir("/sys/class/net"))
    work = Path(tempfile.mkdtemp(prefix="kt-docker-"))  # short: the socket's path is bounded
    if shutil.which("docker") is None or not answers(env):
        dockerd = ENGINE / "usr/sbin/dockerd"
        assert dockerd.exists(), f"{dockerd} is missing: scripts/test unpacks Debian's docker.io"
        env["PATH"] = f"{ENGINE}/usr/bin{os.pathsep}{ENGINE}/usr/sbin{os.pathsep}{env['PATH']}"
        env["DOCKER_HOST"] = f"unix://{work}/docker.sock"
        # its containerd writes /opt/containerd and /run/containerd/s whatever dockerd is
        # told: in mounts of its own, the machine never sees them
        mounts = PrivateMounts(work, name="docker").start()
        # no iptables rules: containers reach the host's bridge address without NAT
        engine = ManagedProcess(
            mounts.enter([str(dockerd), "--iptables=false", "--data-root", str(work / "data"),
                          "--exec-root", str(work / "exec"), "--pidfile", str(work / "dockerd.pid"),
                          "-H", env["DOCKER_HOST"]]),
            name="dockerd", env=env,
        )  # fmt: skip
    try:
        wait_for(lambda: answers(env), timeout=60, what="Docker's engine to answer")
        found = Docker(env, IMAGE)
        if found("image", "inspect", IMAGE).returncode != 0:
            assert ROOTFS.exists(), f"{ROOTFS} is missing: scripts/test makes it with debootstrap"
            imported = found("import", str(ROOTFS), IMAGE, timeout=300)
            assert imported.returncode == 0, imported.stderr
        yield found
    finally:
        if engine is not None:
            engine.stop(timeout=30)
        if mounts is not None:
            mounts.stop()
        if engine is not None:
            # the engine's bridges only: other tests make links of their own meanwhile
            for made in set(os.listdir("/sys/class/net")) - interfaces:
                if made == "docker0" or made.startswith("br-"):
                    subprocess.run(["ip", "link", "del", made], capture_output=True, timeout=30)
            shutil.rmtree(work, ignore_errors=True)
