"""`kubectl port-forward` through a real kube-apiserver, kubelet and containerd to a real
pod: each real kubectl here (Debian's 1.20 speaks SPDY, the newest websockets), then
kafkatunnel's own supervised forward. The pod's address exists only inside the cluster's
network namespace, so whatever reaches it went through the API server."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from pathlib import Path

import pytest

from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.kube.kubectl import Kubectl
from kafkatunnel.kube.portforward import PortForward, probe_tcp
from tests.kube.conftest import KUBECTLS, NEWEST
from tests.kube.real.conftest import ECHO_PORT
from tests.worlds.kubernetes import POD_SUBNET, KubernetesCluster


def echoed(sock: socket.socket, message: bytes, timeout: float = 10) -> bytes:
    """What comes back for `message`, read until as long or the far end stops."""
    sock.settimeout(timeout)
    sock.sendall(message)
    got = b""
    while len(got) < len(message):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def echoed_from_the_host(address: str, message: bytes) -> bytes:
    """What the host gets back sending `message` to address:7000 directly (a machine's
    default route may lead to something that takes any connection: not the pod)."""
    try:
        with socket.create_connection((address, ECHO_PORT), timeout=3) as sock:
            return echoed(sock, message, timeout=3)
    except OSError:
        return b""


def test_the_pod_address_is_reached_only_inside(
    kubernetes: KubernetesCluster, echo_pod: str
) -> None:
    pod = kubernetes.api("GET", f"/api/v1/namespaces/default/pods/{echo_pod}")
    address = pod["status"]["podIP"]
    assert ipaddress.ip_address(address) in ipaddress.ip_network(POD_SUBNET)
    message = b"from the cluster's network\n"
    with kubernetes.connect(address, ECHO_PORT) as inside:
        assert echoed(inside, message) == message
    assert echoed_from_the_host(address, message) != message


@pytest.mark.parametrize("version", list(KUBECTLS))
def test_kubectl_port_forward_reaches_the_pod(
    kubernetes: KubernetesCluster, echo_pod: str, version: str
) -> None:
    argv = [KUBECTLS[version], "--kubeconfig", str(kubernetes.kubeconfig), "port-forward",
            f"pod/{echo_pod}", f":{ECHO_PORT}"]  # fmt: skip
    forward = ManagedProcess(argv, name=f"kubectl-{version}-port-forward")
    try:
        line = forward.wait_for_line(r"^Forwarding from 127\.0\.0\.1:(\d+) ->", timeout=60)
        message = f"through kubectl {version}, kube-apiserver and the kubelet\n".encode()
        for _ in range(3):  # each connection is a new stream pair through the kubelet
            with socket.create_connection(("127.0.0.1", int(line[1])), timeout=10) as sock:
                assert echoed(sock, message) == message, forward.output()
    finally:
        forward.stop()


def echo_through_forward(kubeconfig: Path, pod_name: str, message: bytes) -> bytes:
    """What the echo pod sends back through the supervised `kubectl port-forward` that
    `up --via kubectl` runs for each broker, as the user of `kubeconfig`."""

    async def pod() -> str:
        return pod_name

    async def run() -> bytes:
        kubectl = Kubectl(binary=KUBECTLS[NEWEST], kubeconfig=str(kubeconfig))
        forward = PortForward(kubectl, pod, ECHO_PORT, lambda: None, probe=probe_tcp)
        forward.start()
        try:
            port = await forward.wait_ready(60)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(message)
            got = await asyncio.wait_for(reader.readexactly(len(message)), 10)
            writer.close()
            return got
        finally:
            await forward.stop()

    return asyncio.run(run())


def test_kafkatunnels_forward_reaches_the_pod(kubernetes: KubernetesCluster, echo_pod: str) -> None:
    """The supervised `kubectl port-forward` that `up --via kubectl` runs for each broker."""
    message = b"through kafkatunnel's forward\n"
    assert echo_through_forward(kubernetes.kubeconfig, echo_pod, message) == message
