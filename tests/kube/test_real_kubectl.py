"""--via kubectl with the real kubectl binaries, not the stand-in: every kubectl found on this
machine (the one on PATH, and each `kubectl.1.NN` the Google Cloud SDK ships beside it)
talks to tests/kube/apiserver.py, which serves the stand-in's world over the Kubernetes API
and pods/portforward over SPDY/3.1. What kubectl prints, when it exits and how it fails are
then kubectl's own, in every version here, and the supervisor's reading of them is tested
against that rather than against lines copied into the stand-in."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from kafkatunnel.demo import LocalCluster
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.kube.kubectl import Kubectl
from kafkatunnel.kube.portforward import LOST, TROUBLE, PortForward, probe_through
from kafkatunnel.waiting import wait_for
from tests.kube.conftest import KUBECTLS, World, needs_kubectl, says, up, version_of
from tests.kube.faults import (
    every_group_works,
    forward_of,
    kube_tunnel,
    make_zombie,
    ready_routes,
    restarted,
)


@needs_kubectl
@pytest.mark.parametrize("version", list(KUBECTLS))
def test_each_kubectl_version_forwards_and_is_restarted_when_its_pod_goes(
    cluster: LocalCluster, apiserver: Path, version: str
) -> None:
    """The supervisor finds the local port in this version's "Forwarding from" line; when
    the API server drops the connection, and when the pod is gone (the kubelet's "No such
    container", after which kubectl 1.23+ closes its connection), kubectl exits with "lost
    connection to pod" and a new one, started at once, works."""
    broker = cluster.mock[0]

    async def run() -> None:
        kubectl = Kubectl(binary=KUBECTLS[version], namespace="kafka")
        forward = PortForward(kubectl, _pod("kafka-0"), broker.port, lambda: None,
                              keepalive=3600)  # fmt: skip
        forward.start()
        try:
            port = await forward.wait_ready(30)
            assert await probe_through(port, 10) is None
            for fault, content in (("lost-kafka-0", ""), ("zombie-kafka-0", "gone")):
                old = forward.process
                assert old is not None
                claim = Path(f"{apiserver}.{fault}")
                claim.write_text(content)
                await _claimed(claim)
                if content == "gone":  # a connection meets the gone pod: kubectl says so
                    assert await probe_through(port, 10) is not None
                await asyncio.wait_for(old.wait(), 30)  # by itself, or killed on its word
                # what ended it: kubectl's own word, or the "No such container" line that
                # had the supervisor probe (and replace) it while kubectl was closing
                port = await _ready_again(forward, old)
                said = f"{forward.last_drop} {forward.last_replacement}"
                assert LOST in said or (content == "gone" and "No such container" in said), said
                assert await probe_through(port, 10) is None, fault
            assert forward.restarts == 2
            assert forward.drops + forward.replacements == 2
            assert "dropped; last: " in forward.describe()
        finally:
            await forward.stop()

    asyncio.run(run())


def _pod(name: str) -> Callable[[], Awaitable[str]]:
    async def resolve() -> str:
        return name

    return resolve


async def _claimed(fault: Path) -> None:
    """Until the API server has taken the fault file (it looks every 50 ms)."""
    deadline = time.monotonic() + 10
    while fault.exists():
        assert time.monotonic() < deadline, f"{fault.name} not taken"
        await asyncio.sleep(0.02)


async def _ready_again(forward: PortForward, old: asyncio.subprocess.Process) -> int:
    deadline = time.monotonic() + 30
    while forward.process is old or forward.local_port is None:
        assert time.monotonic() < deadline, forward.describe()
        await asyncio.sleep(0.05)
    return await forward.wait_ready(30)


@needs_kubectl
def test_what_every_version_says_of_a_pod_that_restarted_or_went(
    cluster: LocalCluster, apiserver: Path
) -> None:
    """Every version at once (each waits out client-go's 30 s stream timeout): a pod that
    restarted leaves kubectl alive and logging "error creating error stream ... Timeout
    occur(r)ed" for each connection; a gone pod's "an error occurred forwarding" comes
    before "lost connection to pod" (1.23 on; 1.20 stays alive). The supervisor's TROUBLE
    and LOST must read each line."""
    pods = {"timeout": "kafka-0", "gone": "kafka-1"}
    runs = {}
    for version, binary in KUBECTLS.items():
        for mode, pod in pods.items():
            remote = cluster.mock[int(pod[-1])].port
            run = ManagedProcess([binary, "port-forward", "-n", "kafka", f"pod/{pod}",
                                  f":{remote}"], name=f"kubectl-{version}-{mode}")  # fmt: skip
            runs[version, mode] = (run, int(run.wait_for_line(
                r"^Forwarding from 127\.0\.0\.1:(\d+)", timeout=30)[1]))  # fmt: skip
    try:
        for mode, pod in pods.items():
            Path(f"{apiserver}.zombie-{pod}").write_text(mode)
        wait_for(lambda: not any(Path(f"{apiserver}.zombie-{p}").exists() for p in pods.values()),
                 timeout=10, what="the API server to take the faults")  # fmt: skip
        clients = [_connect(port) for _, port in runs.values()]
        for (version, mode), (run, _) in runs.items():
            if mode == "timeout":
                line = run.wait_for_line(r"error stream", timeout=60)
                assert TROUBLE.search(line.string), (version, line.string)
                assert run.alive(), version
            elif version_of(version) < (1, 23):  # it stays, failing each connection so
                line = run.wait_for_line(r"No such container", timeout=30)
                assert TROUBLE.search(line.string), (version, line.string)
                assert run.alive(), version
            else:  # kubernetes#103526: the first such error ends it
                run.wait_for_line(LOST, timeout=30)
                said = run.output()
                assert TROUBLE.search(said), (version, said)
                wait_for(_exited(run), timeout=10, what=f"kubectl {version} to exit")
                assert run.popen.returncode == 1, (version, said)
        for client in clients:
            client.close()
    finally:
        for run, _ in runs.values():
            run.stop()


def _exited(run: ManagedProcess) -> Callable[[], bool]:
    return lambda: not run.alive()


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


@needs_kubectl
def test_a_forward_left_useless_by_a_restarted_pod_is_replaced(
    cluster: LocalCluster, apiserver: Path
) -> None:
    """The real kubectl stays alive when its pod restarted, answering nothing (kubectl#686):
    the tunnel's periodic check finds it, replaces it, and every group works again."""
    tunnel = kube_tunnel(cluster, keepalive=1.0)
    try:
        wait_for(lambda: ready_routes(tunnel), timeout=30, what="a ready forward each")
        forward = forward_of(tunnel, "kafka-1")
        assert forward.process is not None
        pid = forward.process.pid
        make_zombie("kafka-1", "timeout")
        wait_for(restarted(forward, pid), timeout=30, what="the useless forward to be replaced")
        assert forward.replacements == 1, forward.describe()
        assert "no answer to ApiVersions" in (forward.last_replacement or "")
        every_group_works(cluster, tunnel.bootstrap_servers, f"restarted-{uuid.uuid4().hex[:6]}")
    finally:
        tunnel.stop()


@pytest.mark.parametrize(
    ("line", "trouble"),
    [('E1125 10:00:00.000000   4242 portforward.go:446] "Error creating error stream" '
      'err="Timeout occurred" localPort=5000 remotePort=9092', True),
     ('E1125 10:00:00.000000   4242 portforward.go:475] "Error creating forwarding stream" '
      'err="Timeout occurred" localPort=5000 remotePort=9092', True),
     ('E1125 10:00:00.000000   4242 portforward.go:536] "An error occurred forwarding" '
      'err="error forwarding port 9092 to pod 0123, uid : Error: No such container: 0123" '
      "localPort=5000 remotePort=9092", True),
     ('E1125 10:00:00.000000   4242 portforward.go:481] "Error copying from remote stream to '
      'local connection" err="readfrom tcp4 127.0.0.1:5000: broken pipe" localPort=5000 '
      "remotePort=9092", False),
     ("Handling connection for 5000", False)],
    ids=["error-stream", "forwarding-stream", "forwarding-error", "copy-error", "handling"],
)  # fmt: skip
def test_the_structured_lines_of_kubectl_1_37(line: str, trouble: bool) -> None:
    """Not a binary here: client-go's portforward.go since kubernetes#129331 (merged in
    2026, for kubectl 1.37) logs through HandleErrorWithLogger, which klog writes as
    "message" err="..." key=value. A failed stream must still read as trouble, a broken
    copy (the client left) must not."""
    assert bool(TROUBLE.search(line)) is trouble


def _user(block: str) -> None:
    """The kubeconfig's user, written anew (the fixture's kubeconfig, on KUBECONFIG)."""
    config = Path(os.environ["KUBECONFIG"])
    text = config.read_text()
    config.write_text(text[: text.index("users:")] + "users:\n- name: developer\n  user:\n" + block)


def _exec_plugin(command: str) -> str:
    return (
        "    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n"
        f"      command: {command}\n      interactiveMode: Never\n"
        "      installHint: Install example-auth-plugin with `pip install example-auth-plugin`\n"
    )


@pytest.mark.alone  # a bound on elapsed time
@needs_kubectl
@pytest.mark.parametrize("version", list(KUBECTLS))
def test_a_context_kubectl_cannot_use_is_explained(
    apiserver: Path, world: World, tmp_path: Path, version: str
) -> None:
    """Four ways a laptop's kubeconfig fails before any Kafka byte, each as this version of
    kubectl reports it: `up` says which and what to do, at once, never "cannot reach the
    API server" for a login that expired."""
    (tmp_path / "bin" / "kubectl").unlink()
    (tmp_path / "bin" / "kubectl").symlink_to(KUBECTLS[version])

    says(up("-n", "kafka", "--context", "kind-dmeo"), 'no context "kind-dmeo" in your '
          "kubeconfig", "kubectl config get-contexts")  # fmt: skip

    _user(_exec_plugin("example-auth-plugin"))
    hint = "Install example-auth-plugin with `pip install example-auth-plugin`"
    says(up("-n", "kafka"), "needs the credential plugin `example-auth-plugin`",
          f"not installed: {hint}")  # fmt: skip

    plugin = tmp_path / "expired-sso"
    plugin.write_text("#!/bin/sh\necho 'Error when retrieving token from sso: Token has expired "
                      "and refresh failed' >&2\nexit 255\n")  # fmt: skip
    plugin.chmod(0o755)
    _user(_exec_plugin(str(plugin)))
    says(up("-n", "kafka"), f"credential plugin `{plugin}` failed (exit 255): Error when "
          "retrieving token from sso: Token has expired", "log in again")  # fmt: skip

    _user("    token: expired\n")
    world(unauthorized=True)
    started = time.monotonic()
    result = up("-n", "kafka")
    says(result, "the cluster refused kubectl's credentials", "log in again")
    assert "cannot reach" not in result.stderr
    assert time.monotonic() - started < 15  # nothing retried
