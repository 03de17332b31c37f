"""A cluster stopped leaves nothing: no process, mount, network namespace, cgroup or file,
and a running one writes no machine-wide path (/var/lib/kubelet, /run/containerd, ...).
Started beside the session's cluster (on its worker, after it), which it must not disturb."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.kube.real.conftest import ECHO, ECHO_PORT
from tests.worlds.kubernetes import KubernetesCluster
from tests.worlds.private_mounts import MACHINE_PATHS, present


def _host_mounts() -> str:
    return subprocess.run(["mount"], capture_output=True, text=True, timeout=30).stdout


def test_a_stopped_cluster_leaves_nothing(
    kubernetes: KubernetesCluster, machine_paths_before: set[Path]
) -> None:
    """Beside the session's cluster, which runs pods too: neither made any of MACHINE_PATHS
    that the machine did not have before the suite."""
    assert set(MACHINE_PATHS) >= machine_paths_before
    other = KubernetesCluster()
    with other:
        other.run_pod("echo", ECHO, ports={"echo": ECHO_PORT})
        other.note_containers()
        workdir, namespace = str(other.workdir), other.namespace.name  # type: ignore[union-attr]
        # the pod's mounts are in the node's own mount namespace, not in the machine's
        assert any(m.startswith(workdir) for m in other.private_mounts.mounts())
        assert workdir not in _host_mounts()
        made = present() - machine_paths_before
        assert not made, f"a running cluster wrote machine-wide paths: {sorted(map(str, made))}"
        assert other.leftovers(), "a running cluster shows as leftovers"
    assert other.leftovers() == []
    assert workdir not in _host_mounts()
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
