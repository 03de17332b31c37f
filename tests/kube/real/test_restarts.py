"""The kubelet or containerd killed and started again under a forward: kafkatunnel's
supervised forward comes back by itself, on a new kubectl, and says that it dropped."""

from __future__ import annotations

import asyncio

import pytest

from kafkatunnel.kube.kubectl import Kubectl
from kafkatunnel.kube.portforward import PortForward, probe_tcp
from kafkatunnel.localcluster.kubernetes import KubernetesCluster
from kafkatunnel.waiting import async_wait_for
from tests.kube.conftest import KUBECTLS, NEWEST
from tests.kube.real.conftest import ECHO_PORT
from tests.kube.real.test_idle import echo_through


@pytest.mark.parametrize("component", ["containerd", "kubelet"])
def test_a_forward_comes_back_after_the_node_restarts(
    kubernetes: KubernetesCluster, echo_pod: str, component: str
) -> None:
    async def pod() -> str:
        return echo_pod

    async def run() -> None:
        kubectl = Kubectl(binary=KUBECTLS[NEWEST], kubeconfig=str(kubernetes.kubeconfig))
        forward = PortForward(kubectl, pod, ECHO_PORT, lambda: None, probe=probe_tcp,
                              keepalive=2.0, backoff=(0.5, 2.0))  # fmt: skip
        forward.start()
        try:
            port = await forward.wait_ready(60)
            assert await echo_through(port, b"before\n") == b"before\n"
            kubernetes.kill_and_restart(component)  # in this thread, which outlives it

            async def echoes_again() -> bool:
                again = await forward.wait_ready(60)
                return await echo_through(again, b"after\n") == b"after\n"

            await async_wait_for(
                echoes_again, timeout=90, what="the forward to echo again", interval=0.25
            )
            assert forward.drops == 1, forward.describe()
            assert "1 dropped; last: error: lost connection to pod" in forward.describe()
        finally:
            await forward.stop()

    asyncio.run(run())
