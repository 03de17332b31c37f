"""The pods' Java: Debian's root file system with its Java 17, made by debootstrap and
imported into containerd, runs in a pod, and the API server reads its log from the kubelet."""

from __future__ import annotations

from kafkatunnel.waiting import wait_for
from tests.worlds.kubernetes import JAVA, KubernetesCluster, java_rootfs


def test_a_pod_runs_debians_java(kubernetes: KubernetesCluster) -> None:
    kubernetes.import_image(java_rootfs(), JAVA)
    command = ["/bin/sh", "-c", "java -version 2>&1; exec sleep 3600"]
    kubernetes.run_pod("java", command, image=JAVA.name)
    try:
        path = "/api/v1/namespaces/default/pods/java/log"
        log = wait_for(lambda: "VM" in (text := kubernetes.api("GET", path)) and text,
                       timeout=60, what="the java pod's log", interval=0.25)  # fmt: skip
        assert 'openjdk version "17.' in log, log
    finally:
        kubernetes.delete_pod("java")
