"""The forwarder follows the broker pods (kafkatunnel/kube/pod_follow.py): with `watch pods`
granted it watches them, with only get/list it lists them while a broker is down, and
either way a forward is tried the moment its pod is Ready, not at the end of its backoff,
and a forward left on a pod made again under its name is replaced before a client meets
it. With the stand-in kubectl over a world file, and a real kubectl over the API server
that serves the same world (its own watch output, read as kubectl prints it)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from kafkatunnel.demo import LocalCluster
from kafkatunnel.kube.forwarder import KubectlForwarder
from kafkatunnel.kube.kubectl import Kubectl
from kafkatunnel.kube.portforward import PortForward, probe_through
from kafkatunnel.waiting import DeadlineExceeded, async_wait_for
from tests.kube.conftest import World

LEAST_PRIVILEGE = ["get pods", "list pods", "create pods/portforward"]
BACKOFF = (10.0, 30.0)  # a retry at the end of the pause comes 5 s or more after the failure
WITHIN = 3.0  # seconds from the pod's Ready to the forward being up, when followed


def change_pod(path: Path, name: str, **changes: Any) -> None:
    state = json.loads(path.read_text())
    pods = state["namespaces"]["kafka"]["pods"]
    next(p for p in pods if p["name"] == name).update(changes)
    new = path.with_suffix(".new")
    new.write_text(json.dumps(state))
    new.replace(path)  # whole, never half-written, for whoever reads it now


@pytest.mark.parametrize("rbac", ["watch", "listing"])
def test_a_pod_made_again_is_forwarded_to_as_soon_as_it_is_ready(
    cluster: LocalCluster, world: World, kubectl: str, rbac: str
) -> None:
    """kafka-1's pod goes (its kubectl dies, as it does when its pod is deleted) and comes
    back under its name with a new UID, not Ready for a while, then Ready: the forward is
    up within WITHIN of Ready though its backoff pauses 5 s or more, and answers."""
    allowed = LEAST_PRIVILEGE + (["watch pods"] if rbac == "watch" else [])
    path = world(allowed=allowed, user="jane")
    change_pod(path, "kafka-1", uid="first")
    broker = cluster.mock[1]

    async def run() -> float:
        forwarder = KubectlForwarder(Kubectl(namespace="kafka"), backoff=BACKOFF,
                                     ready_timeout=30)  # fmt: skip
        await forwarder.prepare()
        try:
            upstream = await forwarder.open("kafka-1.kafka-headless", broker.port)
            upstream.close()
            await async_wait_for(_async(lambda: forwarder.following), timeout=30,
                                 what="the forwarder to follow the pods")  # fmt: skip
            assert forwarder.following == rbac
            forward = next(iter(forwarder.forwards.values()))
            assert forward.process is not None and forward.local_port is not None
            change_pod(path, "kafka-1", uid="second", ready=False)
            if rbac == "listing":  # nobody tells the tunnel: its kubectl dies with the pod
                os.kill(forward.process.pid, signal.SIGKILL)
            await async_wait_for(_async(lambda: forward.local_port is None), timeout=30,
                                 what="the forward to the old pod to end")  # fmt: skip
            await async_wait_for(_async(lambda: forward.state.startswith("restarting")),
                                 timeout=30, what="the forward to wait for the pod")  # fmt: skip
            change_pod(path, "kafka-1", ready=True)
            ready = time.monotonic()
            port = await forward.wait_ready(30)
            took = time.monotonic() - ready
            assert await probe_through(port, 10) is None
            if rbac == "watch":
                assert forward.replacements == 1, forward.describe()
                assert forward.last_replacement == "pod kafka-1 was made again"
            return took
        finally:
            await forwarder.close()

    took = asyncio.run(run())
    assert took < WITHIN, f"the forward was up {took:.1f}s after its pod was Ready"


def _async(check: Any) -> Any:
    async def condition() -> Any:
        return check()

    return condition


@pytest.mark.parametrize("starting", [True, False])
def test_a_forward_to_a_starting_pod_never_backs_off_past_a_second(starting: bool) -> None:
    """A kubectl that fails at once each time (as one does whose connection the pod's
    port refuses, before its JVM listens): while the pod is known to be starting, the
    tries come at most a second apart; otherwise the backoff doubles (1, 2, 4, 8 s...)."""

    async def pod() -> str:
        return "kafka-1"

    async def run() -> float:
        forward = PortForward(Kubectl(binary="false"), pod, 9092, lambda: None,
                              backoff=(1.0, 30.0), starting=lambda: starting)  # fmt: skip
        began = time.monotonic()
        forward.start()
        try:
            await async_wait_for(_async(lambda: forward.restarts >= 6), timeout=12,
                                 what="six tries of the forward")  # fmt: skip
            return time.monotonic() - began
        finally:
            await forward.stop()

    if starting:
        took = asyncio.run(run())
        assert took < 8, took  # five pauses of at most a second, and six kubectl runs
    else:  # five pauses of 0.5-1, 1-2, 2-4, 4-8 and 8-16 s: not within the deadline
        with pytest.raises(DeadlineExceeded):
            asyncio.run(run())
