"""RBAC by the real authorizer: a user holding exactly get/list pods and create
pods/portforward forwards; without pods/portforward, kubectl, `up` and `doctor` are refused,
and say so."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kafkatunnel.demo import free_port
from kafkatunnel.doctor import FAIL, PASS, RBAC_VERBS, SKIP, check_kubectl
from kafkatunnel.kube.kubectl import Kubectl
from tests.kube.conftest import KUBECTLS, NEWEST, OLDEST
from tests.kube.real.conftest import ECHO_PORT
from tests.kube.real.test_port_forward import echo_through_forward, echoed
from tests.worlds.kubernetes import KubernetesCluster, User

Rule = dict[str, list[str]]
WATCH = "RBAC: watch pods (optional)"
PODS: Rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}
PORTFORWARD: Rule = {"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["create"]}


def grant(
    kubernetes: KubernetesCluster, user: str, rules: list[Rule], namespace: str = "default"
) -> User:
    """A user whose only permissions in `namespace` are `rules` (a Role and its
    RoleBinding), besides what every authenticated user has."""
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    kubernetes.api("POST", f"{rbac}/roles", {"metadata": {"name": user}, "rules": rules})
    kubernetes.api("POST", f"{rbac}/rolebindings", {
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": user},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    })  # fmt: skip
    return kubernetes.user(user)


@pytest.fixture(scope="module")
def forwarder(kubernetes: KubernetesCluster) -> User:
    return grant(kubernetes, "forwarder", [PODS, PORTFORWARD])


@pytest.fixture(scope="module")
def reader(kubernetes: KubernetesCluster) -> User:
    return grant(kubernetes, "reader", [PODS])


def port_forward(version: str, user: User, pod: str) -> list[str]:
    """kubectl `version`'s port-forward to the echo pod, as `user`."""
    return [KUBECTLS[version], "--kubeconfig", str(user.kubeconfig), "port-forward",
            f"pod/{pod}", f":{ECHO_PORT}"]  # fmt: skip


@pytest.mark.parametrize("version", sorted({OLDEST, NEWEST}))
def test_get_list_pods_and_create_portforward_are_enough(
    forwarder: User, echo_pod: str, version: str
) -> None:
    argv = port_forward(version, forwarder, echo_pod)
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("Forwarding from 127.0.0.1:"), (line, process.stderr)
        port = int(line.split(":")[1].split()[0])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            assert echoed(sock, b"allowed\n") == b"allowed\n"
    finally:
        process.kill()
        process.wait(timeout=30)


@pytest.mark.parametrize("version", sorted({OLDEST, NEWEST}))
def test_without_pods_portforward_kubectl_is_refused(
    reader: User, echo_pod: str, version: str
) -> None:
    result = subprocess.run(
        port_forward(version, reader, echo_pod), capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0, result.stdout
    assert 'User "reader" cannot create resource "pods/portforward"' in result.stderr


def test_kafkatunnels_forward_as_a_user_with_exactly_those_permissions(
    forwarder: User, echo_pod: str
) -> None:
    assert echo_through_forward(forwarder.kubeconfig, echo_pod, b"as forwarder\n") == (
        b"as forwarder\n"
    )


def up(user: User, *args: str) -> subprocess.CompletedProcess[str]:
    """`kafkatunnel up --via kubectl` as `user`, over the echo pod (labelled app=echo)."""
    argv = [sys.executable, "-m", "kafkatunnel", "up", "--via", "kubectl", "--no-table",
            "--kubeconfig", str(user.kubeconfig), "-n", "default", "-l", "app=echo",
            "--kafka-port", str(ECHO_PORT), *args]  # fmt: skip
    env = {**os.environ, "PATH": f"{Path(KUBECTLS[NEWEST]).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def _rbac(user: User) -> dict[str, str]:
    kubectl = Kubectl(binary=KUBECTLS[NEWEST], kubeconfig=str(user.kubeconfig),
                      namespace="default")  # fmt: skip
    return {r.check: r.status for r in check_kubectl(kubectl) if r.check.startswith("RBAC")}


# each permission `up` needs, and a user holding the others only
WITHOUT = {
    "get pods": [{**PODS, "verbs": ["list"]}, PORTFORWARD],
    "list pods": [{**PODS, "verbs": ["get"]}, PORTFORWARD],
    "create pods/portforward": [PODS],
}


@pytest.mark.parametrize("missing", WITHOUT)
def test_without_each_permission_up_and_doctor_stop_naming_it(
    kubernetes: KubernetesCluster, echo_pod: str, missing: str
) -> None:
    name = "without-" + missing.replace(" ", "-").replace("/", "-")
    user = grant(kubernetes, name, WITHOUT[missing])
    result = up(user, "--listen", f"127.0.0.1:{free_port()}")
    text = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0, text
    assert f'RBAC forbids {missing} in namespace "default" for user "{name}"' in text, text
    assert "Traceback" not in text, text
    expected = {f"RBAC: {verb} {resource}": PASS for verb, resource in RBAC_VERBS}
    assert _rbac(user) == {**expected, f"RBAC: {missing}": FAIL, WATCH: SKIP}


def test_doctor_passes_a_user_with_exactly_those_permissions(forwarder: User) -> None:
    """doctor asks about the subresource (`--subresource=portforward`): asked as
    `pods/portforward`, kubectl reads TYPE/NAME, a pod named portforward, and the real
    authorizer says no to a user who may port-forward."""
    assert _rbac(forwarder) == {
        "RBAC: get pods": PASS,
        "RBAC: list pods": PASS,
        "RBAC: create pods/portforward": PASS,
        WATCH: SKIP,  # optional: not granted, up lists the pods instead
    }


def test_doctor_says_watch_on_pods_is_granted(kubernetes: KubernetesCluster) -> None:
    watcher = grant(kubernetes, "watcher", [{**PODS, "verbs": ["get", "list", "watch"]},
                                            PORTFORWARD])  # fmt: skip
    assert _rbac(watcher)[WATCH] == PASS
