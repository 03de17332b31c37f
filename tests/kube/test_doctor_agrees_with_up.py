"""doctor with no tunnel running answers "can `kafkatunnel up` start with these flags?", and
its answer is up's: each world below is tried with both, and doctor passes exactly when up
starts. Minimal RBAC (get/list pods, create pods/portforward, nothing on namespaces), a
forbidden port-forward, up's no-flag choice of namespace for Strimzi KRaft and Bitnami, and
no right to look for brokers elsewhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.waiting import wait_for
from tests.kube.conftest import World
from tests.kube.distributions import distribution_pods

CASES: dict[str, tuple[dict[str, Any], str | None, bool, str]] = {
    # name: (world changes, distribution in namespace "kafka", flags name the namespace,
    #        what doctor's failing or telling check says)
    "minimal-rbac": ({"allowed": ["get pods", "list pods", "create pods/portforward"]}, None, True,
                     "kafka-0, kafka-1, kafka-2 in namespace kafka"),
    "portforward-forbidden": ({"forbidden": ["create pods/portforward"]}, None, True,
                              "forbidden in namespace kafka"),
    "strimzi-kraft-no-flags": ({}, "strimzi-kraft", False,
                               "my-cluster-brokers-3, my-cluster-brokers-4, my-cluster-brokers-5 "
                               "in namespace kafka"),
    "bitnami-no-flags": ({}, "bitnami", False,
                         "kafka-broker-0, kafka-broker-1, kafka-broker-2 in namespace kafka"),
    "no-right-to-look-elsewhere": ({"forbidden": ["list pods --all-namespaces"]}, None, False,
                                   "no pods at all in the current namespace"),
}  # fmt: skip
STARTS = {"minimal-rbac", "strimzi-kraft-no-flags", "bitnami-no-flags"}
DOCTOR_WITHIN = 120  # each kubectl may take seconds on a machine as busy as the suite's


def _argv(command: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "kafkatunnel", command, *args]


def _doctor(flags: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """doctor's answer; one that does not come within DOCTOR_WITHIN (about ten kubectl
    calls, most side by side, and a port-forward) fails the test with where it waited:
    SIGABRT makes Python's faulthandler write every thread's stack."""
    argv = _argv("doctor", "--json", *flags)
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**env, "PYTHONFAULTHANDLER": "1"}) as doctor:  # fmt: skip
        try:
            out, err = doctor.communicate(timeout=DOCTOR_WITHIN)
        except subprocess.TimeoutExpired:
            doctor.send_signal(signal.SIGABRT)
            out, err = doctor.communicate(timeout=30)
            pytest.fail(f"doctor did not end within {DOCTOR_WITHIN} s; it wrote {out!r} and, "
                        f"stopped, where it waited:\n{err}")  # fmt: skip
    return subprocess.CompletedProcess(argv, doctor.returncode, out, err)


def _up_starts(argv: list[str], state: Path) -> tuple[bool, str]:
    """Whether up printed its bootstrap.servers (it started) or exited (it could not)."""
    up = ManagedProcess(argv, name="kafkatunnel-up", env={"KAFKATUNNEL_STATE_DIR": str(state)})
    try:
        wait_for(lambda: "bootstrap.servers=" in up.output() or not up.alive(), timeout=40,
                 what="up to start or to exit")  # fmt: skip
        return "bootstrap.servers=" in up.output(), up.output()
    finally:
        up.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_doctor_passes_exactly_when_up_starts(
    cluster: LocalCluster, world: World, tmp_path: Path, case: str
) -> None:
    changes, distribution, name_namespace, said = CASES[case]
    path = world(user="jane", **changes)
    if distribution is not None:
        state = json.loads(path.read_text())
        state["namespaces"]["kafka"]["pods"] = distribution_pods(cluster, distribution)
        path.write_text(json.dumps(state))
    flags = ["--kafka-port", str(cluster.mock[0].port)]
    flags += ["-n", "kafka"] if name_namespace else []

    env = {**os.environ, "KAFKATUNNEL_STATE_DIR": str(tmp_path)}
    doctor = _doctor(flags, env)
    report = json.loads(doctor.stdout)
    details = " ".join(f"{c['check']}: {c['status']}: {c['detail']}" for c in report["checks"])
    started, output = _up_starts(
        _argv("up", "--no-table", "--listen", f"127.0.0.1:{free_port_run(8)}", *flags), tmp_path
    )

    assert started == (case in STARTS), output
    assert (doctor.returncode == 0) == started, (details, output)
    assert report["ok"] == started
    assert said in " ".join(details.split()), details
    checks = {c["check"]: c["status"] for c in report["checks"]}
    if started:  # doctor tried what up does first: a forward to the bootstrap broker
        assert checks["port-forward to the bootstrap"] == "pass", details
    assert "Traceback" not in doctor.stderr + output
