"""`kafkatunnel up` with no flags, as the README leads: through kubectl, finding the brokers
of the common distributions in the current namespace or, when they are elsewhere and the
user may list pods in all namespaces, in the one namespace that has them. Only broker pods
get forwards: never Strimzi's ZooKeeper, entity operator or KRaft controller-only pods,
Bitnami's controller-only pods, or Confluent for Kubernetes' KRaft controllers. The worlds
follow the labels and names these operators give their pods (Strimzi 0.4x node pools,
Bitnami chart 31, CFK 2.x)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.waiting import wait_for
from tests.kube.conftest import World
from tests.kube.distributions import distribution_pods


def _port_forwards(pid: int) -> list[str]:
    listing = subprocess.run(["ps", "-ww", "-eo", "ppid,args"], capture_output=True,
                             text=True).stdout.splitlines()  # fmt: skip
    return sorted(line.split("port-forward ", 1)[1].split()[0] for line in listing
                  if "port-forward pod/" in line and int(line.split()[0]) == pid)  # fmt: skip


def _up(tmp_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "kafkatunnel", "up", "--listen",
            f"127.0.0.1:{free_port_run(8)}", "--no-table", *args]  # fmt: skip


@pytest.mark.parametrize(
    ("distribution", "brokers"),
    [
        ("strimzi-kraft", [f"pod/my-cluster-brokers-{i}" for i in (3, 4, 5)]),
        ("strimzi-zookeeper", [f"pod/my-cluster-kafka-{i}" for i in range(3)]),
        ("bitnami", [f"pod/kafka-broker-{i}" for i in range(3)]),
        ("confluent", [f"pod/kafka-{i}" for i in range(3)]),
    ],
)
def test_up_with_no_flags_finds_the_brokers(
    cluster: LocalCluster, world: World, tmp_path: Path, distribution: str, brokers: list[str]
) -> None:
    """No --via, no --namespace, no --bootstrap: the pods are in namespace "kafka" while the
    context's namespace is "default", so the one namespace with brokers is found."""
    path = world()
    state = __import__("json").loads(path.read_text())
    state["namespaces"]["kafka"]["pods"] = distribution_pods(cluster, distribution)
    path.write_text(__import__("json").dumps(state))
    up = ManagedProcess(_up(tmp_path, "--kafka-port", str(cluster.mock[0].port)),
                        name="kafkatunnel-up",
                        env={"KAFKATUNNEL_STATE_DIR": str(tmp_path)})  # fmt: skip
    try:
        up.wait_for_line(r"^broker 3: ", timeout=40)
        assert "using namespace kafka" in up.output()
        forwards = wait_for(lambda: (f := _port_forwards(up.pid)) and len(f) == 3 and f,
                            timeout=15, what="one port-forward per broker")  # fmt: skip
        assert forwards == brokers
    finally:
        up.stop()


def test_brokers_in_several_namespaces_ask_for_one(world: World, tmp_path: Path) -> None:
    path = world()
    state = __import__("json").loads(path.read_text())
    state["namespaces"]["staging"] = {"pods": state["namespaces"]["kafka"]["pods"]}
    path.write_text(__import__("json").dumps(state))
    result = subprocess.run(_up(tmp_path), capture_output=True, text=True, timeout=60,
                            env={**os.environ, "KAFKATUNNEL_STATE_DIR": str(tmp_path)})  # fmt: skip
    text = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, text
    assert "Kafka brokers run in 2 namespaces (kafka: kafka-0, kafka-1, kafka-2; staging:" in text
    assert "--namespace NAME" in text and "Traceback" not in text


def test_without_the_right_to_list_everywhere_the_current_namespace_is_named(
    world: World, tmp_path: Path
) -> None:
    world(forbidden=["list pods --all-namespaces"], user="jane")
    result = subprocess.run(_up(tmp_path), capture_output=True, text=True, timeout=60,
                            env={**os.environ, "KAFKATUNNEL_STATE_DIR": str(tmp_path)})  # fmt: skip
    text = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2 and "no pods at all in the current namespace" in text, text
