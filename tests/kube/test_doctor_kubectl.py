"""doctor's kubectl checks, each failing and passing, against the kubectl stand-in."""

from __future__ import annotations

from kafkatunnel.doctor import FAIL, PASS, SKIP, check_kubectl
from kafkatunnel.kube.kubectl import Kubectl
from tests.kube.conftest import World


def _by_check(kubectl: Kubectl) -> dict[str, tuple[str, str, str]]:
    return {r.check: (r.status, r.detail, r.fix) for r in check_kubectl(kubectl)}


def test_everything_a_tunnel_needs_from_kubectl_passes(world: World) -> None:
    results = _by_check(Kubectl(namespace="kafka"))
    assert {check: status for check, (status, _, _) in results.items()} == {
        "kubectl installed": PASS,
        "kubectl context": PASS,
        "RBAC: get pods": PASS,
        "RBAC: list pods": PASS,
        "RBAC: create pods/portforward": PASS,
        "RBAC: watch pods (optional)": PASS,
    }
    assert results["kubectl context"][1] == "kind-demo"


def test_watch_on_pods_not_granted_is_skipped_with_what_it_would_buy(world: World) -> None:
    world(forbidden=["watch pods"])
    results = _by_check(Kubectl(namespace="kafka"))
    status, detail, fix = results["RBAC: watch pods (optional)"]
    assert status == SKIP, (status, detail)
    assert detail == ("not granted in namespace kafka: up lists the pods every half second "
                      "while a broker is down")  # fmt: skip
    assert "ask for `watch` on `pods`" in fix
    assert all(r[0] == PASS for c, r in results.items() if c != "RBAC: watch pods (optional)")


def test_kubectl_missing(world: World) -> None:
    ((check, (status, _, fix)),) = _by_check(Kubectl(binary="kubectl-not-here")).items()
    assert (check, status) == ("kubectl installed", FAIL)
    assert "install it" in fix


def test_no_current_context(world: World) -> None:
    world(current_context=None)
    status, _, fix = _by_check(Kubectl(namespace="kafka"))["kubectl context"]
    assert status == FAIL and "kubectl config use-context NAME" in fix


def test_a_forbidden_verb_is_named_with_the_role_to_ask_for(world: World) -> None:
    world(forbidden=["create pods/portforward"])
    results = _by_check(Kubectl(namespace="kafka"))
    status, detail, fix = results["RBAC: create pods/portforward"]
    assert status == FAIL and detail == "forbidden in namespace kafka"
    assert "granting `create` on `pods/portforward`" in fix
    assert results["RBAC: get pods"][0] == PASS
