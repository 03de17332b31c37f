"""Where applications in containers on this machine reach the tunnel (`up --for-containers`).

On Linux, containers reach the host at their bridge's address (docker0, or the bridge of a
user-defined network): the tunnel listens there too, on the same ports as on loopback, and
tells those clients that address. On Docker Desktop (macOS, Windows) containers reach the
host's loopback under the name host.docker.internal, so the tunnel stays on loopback and
tells every client that name."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kafkatunnel.tunnel.listeners import address_of
from kafkatunnel.tunnel.tunnel import Audience

DOCKER_BRIDGE = "docker0"
DESKTOP_HOST = "host.docker.internal"
NETWORK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # as docker accepts them
INTERFACE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")  # IFNAMSIZ, no slash
BRIDGE_OPTION = "com.docker.network.bridge.name"


class ContainersError(ValueError):
    """No way for containers to reach the tunnel was found; the message says what to do."""


@dataclass(frozen=True)
class ContainerPlan:
    audience: Audience | None  # Linux: the bridge's address, served besides loopback
    advertise: str | None  # Docker Desktop: the host every client is told
    said: str  # one line for the user: which of the two, and where


def plan(network: str | None, platform: str = sys.platform) -> ContainerPlan:
    if platform == "darwin" or platform.startswith("win"):
        return ContainerPlan(None, DESKTOP_HOST, (
            "containers (Docker Desktop) reach this machine's loopback as "
            f"{DESKTOP_HOST}: every client is told that name"))  # fmt: skip
    bridge = bridge_of(network)
    address = address_of(bridge)
    if address is None:
        raise ContainersError(f"bridge {bridge} has no IPv4 address: is its network up?")
    said = f"containers on bridge {bridge} reach the tunnel at {address}"
    return ContainerPlan(Audience(address, address), None, said)


def bridge_of(network: str | None) -> str:
    """The host's interface for a Docker network: docker0 by default; a network's own
    bridge (`docker network inspect`); or an interface named directly."""
    name = network or DOCKER_BRIDGE
    if not NETWORK_NAME.fullmatch(name):
        raise ContainersError(f"--container-network {name!r} is not a network name")
    if Path("/sys/class/net", name).exists():
        return name
    if network is None:
        raise ContainersError(
            f"no {DOCKER_BRIDGE} bridge here: is Docker installed and running? Name the "
            "bridge or network your containers use with --container-network NAME"
        )
    if shutil.which("docker") is None:
        raise ContainersError(
            f"no interface {name}, and no docker command to ask for network {name}'s "
            "bridge: give the bridge's interface name (ip link show type bridge)"
        )
    found = subprocess.run(
        ["docker", "network", "inspect", "--format",
         "{{index .Options \"" + BRIDGE_OPTION + "\"}} {{.Id}}", "--", name],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if found.returncode != 0:
        reason = (found.stderr.strip().splitlines() or ["no answer"])[-1]
        raise ContainersError(f"docker network inspect {name}: {reason}")
    option, _, identity = found.stdout.strip().rpartition(" ")
    bridge = option.strip() if option.strip() not in ("", "<no value>") else f"br-{identity[:12]}"
    if not INTERFACE_NAME.fullmatch(bridge):  # docker's answer is input too
        raise ContainersError(f"network {name}'s bridge {bridge!r} is not an interface name")
    if not Path("/sys/class/net", bridge).exists():
        raise ContainersError(f"network {name}'s bridge {bridge} is not on this machine")
    return bridge
