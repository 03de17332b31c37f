"""Idle forwards against the real runtime's streaming idle timeout (the cluster's 30 s; with
CRI it is containerd's stream_idle_timeout that closes them, the kubelet's own setting is
for runtimes inside the kubelet): kubectl 1.20, which speaks SPDY without pings, loses an
idle forward; the newest kubectl keeps its own; kafkatunnel's supervised forward keeps its
by checking it more often than the timeout."""

from __future__ import annotations

import asyncio
import time

from kafkatunnel.kube.kubectl import Kubectl
from kafkatunnel.kube.portforward import FORWARDING, LOST, PortForward, probe_tcp
from tests.kube.conftest import KUBECTLS, NEWEST, OLDEST
from tests.kube.real.conftest import ECHO_PORT
from tests.worlds.kubernetes import KubernetesCluster


async def echo_through(port: int, message: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(message)
        return await asyncio.wait_for(reader.readexactly(len(message)), 10)
    finally:
        writer.close()


async def port_forward(
    binary: str, kubeconfig: str, pod: str
) -> tuple[asyncio.subprocess.Process, int]:
    process = await asyncio.create_subprocess_exec(
        binary, "--kubeconfig", kubeconfig, "port-forward", f"pod/{pod}", f":{ECHO_PORT}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    match = FORWARDING.match(line.decode())
    assert match, line
    return process, int(match[1])


def test_an_idle_forward_outlives_the_runtimes_idle_timeout_only_when_kept_alive(
    kubernetes: KubernetesCluster, echo_pod: str
) -> None:
    idle = float(kubernetes.streaming_idle_timeout.removesuffix("s"))
    kubeconfig = str(kubernetes.kubeconfig)

    async def pod() -> str:
        return echo_pod

    async def run() -> None:
        old, old_port = await port_forward(KUBECTLS[OLDEST], kubeconfig, echo_pod)
        new, new_port = await port_forward(KUBECTLS[NEWEST], kubeconfig, echo_pod)
        spdy = Kubectl(binary=KUBECTLS[OLDEST], kubeconfig=kubeconfig)
        kept = PortForward(spdy, pod, ECHO_PORT, lambda: None, keepalive=idle / 3, probe=probe_tcp)
        kept.start()
        try:
            kept_port = await kept.wait_ready(60)
            assert await echo_through(old_port, b"before\n") == b"before\n"
            idle_since = time.monotonic()  # the old forward's last data: its idle time runs
            for port in (new_port, kept_port):
                assert await echo_through(port, b"before\n") == b"before\n"
            # kubectl 1.20's forward, idle, is closed by the runtime: not before the timeout
            await asyncio.wait_for(old.wait(), idle + 30)
            assert time.monotonic() - idle_since >= idle - 1
            assert old.stderr is not None
            assert LOST in (await old.stderr.read()).decode()
            # the others idled as long: both still forward, on the same ports
            assert new.returncode is None
            assert await echo_through(new_port, b"newest\n") == b"newest\n"
            assert await echo_through(kept_port, b"kept\n") == b"kept\n"
            assert (kept.drops, kept.restarts, kept.local_port) == (0, 0, kept_port)
        finally:
            await kept.stop()
            for process in (old, new):
                if process.returncode is None:
                    process.kill()
                await process.wait()

    asyncio.run(run())
