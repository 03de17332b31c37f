"""Nothing of the cluster listens beyond loopback and its own bridge: inside its network
namespace every listening socket is on 127.0.0.1 or the bridge's address (the kubelet), and
on the host only the API server's relay, on loopback."""

from __future__ import annotations

import ipaddress
import subprocess

from tests.worlds.kubernetes import NODE_ADDRESS, KubernetesCluster


def listening(argv: list[str]) -> set[tuple[str, int, str]]:
    """(address, port, process) of each TCP and UDP listener `ss` shows."""
    out = subprocess.run([*argv, "ss", "-Hltunp"], capture_output=True, text=True, timeout=30,
                         check=True).stdout  # fmt: skip
    found = set()
    for line in out.splitlines():
        fields = line.split()
        address, _, port = fields[4].rpartition(":")
        process = fields[6].split('"')[1] if len(fields) > 6 and '"' in fields[6] else "?"
        found.add((address.strip("[]").split("%")[0], int(port), process))
    return found


def on_loopback_or_bridge(address: str) -> bool:
    """`ss` shows a socket on every address as *."""
    if address == "*":
        return False
    return address == NODE_ADDRESS or ipaddress.ip_address(address).is_loopback


def test_the_cluster_listens_on_loopback_and_its_bridge_only(
    kubernetes: KubernetesCluster, echo_pod: str
) -> None:
    inside = listening(kubernetes.inside([]))
    processes = {process for _, _, process in inside}
    assert {"etcd", "kube-apiserver", "kubelet", "containerd"} <= processes, inside
    wide = {(address, port, process) for address, port, process in inside
            if not on_loopback_or_bridge(address)}  # fmt: skip
    assert not wide, f"listening beyond loopback and the bridge: {wide}"
    kubelet = {address for address, port, process in inside if process == "kubelet"}
    assert kubelet == {NODE_ADDRESS}, inside
    relay = {(a, p) for a, p, process in listening([]) if p == kubernetes.port}
    assert relay == {("127.0.0.1", kubernetes.port)}
