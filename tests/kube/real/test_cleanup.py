"""A cluster stopped leaves nothing: no process, mount, network namespace, cgroup or file.
Started beside the session's cluster (on its worker, after it), which it must not disturb."""

from __future__ import annotations

import os
import signal
import subprocess

from tests.kube.real.conftest import ECHO, ECHO_PORT
from tests.worlds.kubernetes import KubernetesCluster


def test_a_stopped_cluster_leaves_nothing(kubernetes: KubernetesCluster) -> None:
    other = KubernetesCluster()
    with other:
        other.run_pod("echo", ECHO, ports={"echo": ECHO_PORT})
        other.note_containers()
        workdir, namespace = str(other.workdir), other.namespace.name  # type: ignore[union-attr]
        assert workdir in subprocess.run(["mount"], capture_output=True, text=True,
                                         timeout=30).stdout  # fmt: skip
        assert other.leftovers(), "a running cluster shows as leftovers"
    assert other.leftovers() == []
    mounts = subprocess.run(["mount"], capture_output=True, text=True, timeout=30).stdout
    assert workdir not in mounts
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                timeout=30).stdout  # fmt: skip
    assert namespace not in namespaces
    # the session's cluster still serves
    assert kubernetes.api("GET", "/readyz") == "ok"


def test_a_cluster_stopped_with_containerd_dead_leaves_nothing(
    kubernetes: KubernetesCluster,
) -> None:
    """containerd killed, the pods' containers live on without it: stop() starts it again to
    stop them, rather than leave them running."""
    other = KubernetesCluster()
    with other:
        other.run_pod("echo", ECHO, ports={"echo": ECHO_PORT})
        other.note_containers()
        containerd = other.processes["containerd"]
        os.kill(containerd.pid, signal.SIGKILL)
        containerd.popen.wait(timeout=30)
    assert other.leftovers() == []
    assert kubernetes.api("GET", "/readyz") == "ok"
