"""--via kubectl: brokers found through pods, one supervised port-forward per broker, every
coordinator reachable, forwards that die come back, and kubectl's failures explained.

Tests that take the `kubectl` fixture run twice: with the stand-in, and with the newest real
kubectl here over an API server that serves the same world (tests/kube/conftest.py). The
twenty kills run once (one_kubectl: the real kubectl where there is one)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.kube.forwarder import KubectlForwarder
from kafkatunnel.kube.kubectl import Kubectl, KubectlError
from kafkatunnel.tunnel import ForwarderError
from kafkatunnel.waiting import wait_for
from tests.kube.conftest import World, says, up
from tests.kube.faults import (
    every_group_works,
    forward_of,
    kube_tunnel,
    ready_routes,
    restarted,
    run_under_faults,
    settled,
    world_file,
)


def test_every_coordinator_through_kubectl_forwards(
    cluster: LocalCluster, world: World, kubectl: str
) -> None:
    tunnel = kube_tunnel(cluster, target="statefulset/kafka")
    try:
        routes = wait_for(lambda: ready_routes(tunnel), timeout=15, what="a ready forward each")
        assert len(routes) == 3
        for node, route in routes.items():
            index = [b.node_id for b in cluster.mock].index(node)
            assert route.startswith(f"kubectl pod/kafka-{index} ")  # the broker-to-pod mapping
        every_group_works(cluster, tunnel.bootstrap_servers, f"kube-{uuid.uuid4().hex[:6]}")
    finally:
        tunnel.stop()


@pytest.mark.alone  # a bound on elapsed time
def test_forwards_survive_twenty_kills(
    cluster: LocalCluster, world: World, one_kubectl: str, request: pytest.FixtureRequest
) -> None:
    """Three brokers, three groups (one per coordinator). Each broker is back within 2 s;
    every produced message reaches the log; every group processes exactly the log, each entry
    once (a group that rejoins after losing its coordinator is redelivered records from its
    last commit, which it recognises by (partition, offset) and skips).

    The librdkafka mock broker does not deduplicate an idempotent producer's retried batch
    (same producer id, epoch and sequence): a retry after a kill can be appended twice (a CI
    run saw 6 in 20 kills). So the groups are held to the log exactly, the produced messages
    to be all in it, and anything more to be second copies of requests in flight at a kill. (The
    tansu broker is no better a judge: under the same faults it acknowledged every message
    and kept 1,484 of 1,500.)"""
    tunnel = kube_tunnel(cluster)  # default selectors find the pods
    request.addfinalizer(tunnel.stop)
    topic = f"faults-{uuid.uuid4().hex[:6]}"
    groups = [gs[0] for gs in cluster.groups_by_coordinator(1, prefix=f"{topic}-g").values()]

    def twenty_kills(_acknowledged: Callable[[], int]) -> list[float]:
        """Each pod's kubectl in turn, SIGKILLed or printing "lost connection to pod" and
        exiting 1; how long each broker took to come back."""
        pods = ["kafka-0", "kafka-1", "kafka-2"]
        restore_times = []
        for kill in range(20):
            pod = pods[kill % len(pods)]
            forward = forward_of(tunnel, pod)
            wait_for(settled(forward), timeout=30, what=f"{pod}'s forward to be up and settled")
            assert forward.process is not None
            pid = forward.process.pid
            started = time.monotonic()
            if kill % 2:
                world_file(f"lost-{pod}").touch()  # kubectl prints the lost lines, exits 1
            else:
                os.kill(pid, signal.SIGKILL)
            wait_for(restarted(forward, pid), timeout=10, what=f"{pod}'s forward to come back")
            restore_times.append(time.monotonic() - started)
        return restore_times

    run = run_under_faults(tunnel, groups, topic, twenty_kills)
    assert max(run.restore_times) < 2.0, run.restore_times
    assert run.failed == 0 and run.acknowledged
    assert run.log.consumed == run.log_size
    assert set(run.log.values) == run.acknowledged  # nothing acknowledged is lost
    copies = Counter(run.log.values)
    duplicated = {value: n for value, n in copies.items() if n > 1}
    # the mock's duplicates: a retried request appended twice, never more; at most the
    # requests in flight on the killed connection (librdkafka's idempotent producer keeps
    # at most 5; at one message per 20 ms and linger.ms=5, one message each)
    assert set(duplicated.values()) <= {2}, duplicated
    assert len(duplicated) <= 5 * len(run.restore_times), duplicated
    for group, result in run.results.items():
        said = (group, len(result.values), result.redelivered, result.errors[-3:])
        assert sorted(result.values) == sorted(run.log.values), said


def test_kubectl_not_installed(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(KubectlError, match=r"kubectl not found .* install it"):
        Kubectl().check_installed()
    says(up("-n", "kafka"), "kubectl not found", "--via exec")


def test_no_current_context(world: World) -> None:
    world(current_context=None)
    says(up("-n", "kafka"), "kubectl has no current context", "kubectl config use-context")


def test_rbac_forbids_listing_pods(world: World, kubectl: str) -> None:
    world(forbidden=["list pods"], user="jane")
    says(up("-n", "kafka"), 'RBAC forbids list pods in namespace "kafka" for user "jane"',
          "kubectl auth can-i list pods")  # fmt: skip


def test_rbac_forbids_port_forwarding(cluster: LocalCluster, world: World, kubectl: str) -> None:
    world(forbidden=["create pods/portforward"], user="jane")

    async def open_one() -> None:
        forwarder = KubectlForwarder(Kubectl(namespace="kafka"), ready_timeout=3)
        await forwarder.prepare()
        try:
            await forwarder.open(cluster.mock[0].host, cluster.mock[0].port)
        finally:
            await forwarder.close()

    with pytest.raises(ForwarderError, match="RBAC forbids create pods/portforward"):
        asyncio.run(open_one())


@pytest.mark.alone  # a bound on elapsed time
def test_up_exits_when_port_forwarding_is_forbidden(world: World, kubectl: str) -> None:
    """Before printing bootstrap.servers: the first forward fails, and `up` says which verb
    on which resource is missing instead of serving and logging it every few seconds. A
    refusal by RBAC is final: `up` does not spend --start-timeout retrying it."""
    world(forbidden=["create pods/portforward"], user="jane")
    started = time.monotonic()
    result = up("-n", "kafka")
    says(result, "cannot reach the bootstrap broker", "RBAC forbids create pods/portforward",
          "ask your cluster admin")  # fmt: skip
    assert "did not answer within" not in result.stderr
    assert "bootstrap.servers=" not in result.stdout
    assert time.monotonic() - started < 10


def test_namespace_not_found(world: World, kubectl: str) -> None:
    """Told from the pod listing (an empty list, as for a namespace that does not exist):
    `up` needs no right to get namespaces."""
    says(up("-n", "kafak"), 'no pods at all in namespace "kafak"', "--namespace")


# docs/quickstart-kubernetes.md: "get/list on pods and create on pods/portforward"
LEAST_PRIVILEGE = ["get pods", "list pods", "create pods/portforward"]


def test_the_least_privilege_the_docs_list_is_enough(
    cluster: LocalCluster, world: World, kubectl: str, tmp_path: Path
) -> None:
    """The Role the docs ask for, and nothing else: get/list pods and create
    pods/portforward granted, every other rule denied. up serves."""
    from kafkatunnel.demo.processes import ManagedProcess

    world(allowed=LEAST_PRIVILEGE, user="jane")
    up = ManagedProcess(
        [sys.executable, "-m", "kafkatunnel", "up", "--via", "kubectl", "-n", "kafka",
         "--kafka-port", str(cluster.mock[0].port), "--listen",
         f"127.0.0.1:{free_port_run(8)}", "--no-table"],
        name="kafkatunnel-up", env={"KAFKATUNNEL_STATE_DIR": str(tmp_path)},
    )  # fmt: skip
    try:
        up.wait_for_line(r"^broker 3: ", timeout=30)
    finally:
        up.stop()


@pytest.mark.parametrize(
    ("pod", "said"),
    [({"phase": "Pending", "ip": None}, "pod kafka-1 is Pending, not Running"),
     ({"ready": False}, "pod kafka-1 is Running but not Ready")],
    ids=["pending", "not-ready"],
)  # fmt: skip
def test_a_pod_that_cannot_serve_is_named_as_such(
    cluster: LocalCluster, world: World, kubectl: str, pod: dict[str, object], said: str
) -> None:
    path = world()
    state = json.loads(path.read_text())
    state["namespaces"]["kafka"]["pods"][1].update(pod)
    path.write_text(json.dumps(state))
    broker = cluster.mock[1]

    async def open_it() -> None:
        forwarder = KubectlForwarder(Kubectl(namespace="kafka"), ready_timeout=3)
        await forwarder.prepare()
        try:
            await forwarder.open("kafka-1.kafka-headless", broker.port)
        finally:
            await forwarder.close()

    with pytest.raises(ForwarderError, match=said):
        asyncio.run(open_it())


def test_target_not_found(world: World, kubectl: str) -> None:
    says(up("-n", "kafka", "--target", "statefulset/kafak"), 'statefulset "kafak" not found',
          "--target")  # fmt: skip


def test_no_kafka_pods(world: World, kubectl: str) -> None:
    path = world()
    state = json.loads(path.read_text())
    state["namespaces"]["default"]["pods"] = [
        {"name": "web-0", "ip": "127.0.0.1", "ports": [8080], "labels": {"app": "web"}}
    ]
    path.write_text(json.dumps(state))
    says(up("-n", "default"), 'no Kafka pods found in namespace "default"',
          "--target statefulset/NAME")  # fmt: skip


@pytest.mark.parametrize(
    ("options", "selector"),
    [
        (
            {"target": "statefulset/kafka"},
            "app.kubernetes.io/instance=demo,app.kubernetes.io/name=kafka",
        ),
        (
            {"target": "svc/kafka-headless"},
            "app.kubernetes.io/instance=demo,app.kubernetes.io/name=kafka",
        ),
        ({"selector": "app.kubernetes.io/instance=demo"}, "app.kubernetes.io/instance=demo"),
        ({}, "app.kubernetes.io/name=kafka"),  # the Bitnami-style default
    ],
    ids=["statefulset", "service", "selector", "default"],
)
def test_ways_to_name_the_brokers(
    world: World, kubectl: str, options: dict[str, str], selector: str
) -> None:
    async def prepare() -> KubectlForwarder:
        forwarder = KubectlForwarder(Kubectl(namespace="kafka"), **options)  # type: ignore[arg-type]
        await forwarder.prepare()
        return forwarder

    forwarder = asyncio.run(prepare())
    assert forwarder.selector == selector
    assert [p.name for p in forwarder.pods] == ["kafka-0", "kafka-1", "kafka-2"]
    assert forwarder.default_bootstrap(9092) == "kafka-0:9092"


@pytest.mark.parametrize("bootstrap", ["given", "default"])
def test_a_killed_tunnel_leaves_no_port_forward_behind(
    cluster: LocalCluster, world: World, kubectl: str, tmp_path: Path, bootstrap: str
) -> None:
    """One port-forward per broker, the bootstrap's included: the default bootstrap
    (kafka-0:PORT, the first pod) shares its broker's forward instead of running its own."""
    from kafkatunnel.demo.processes import ManagedProcess
    from kafkatunnel.pids import pid_alive

    where = (["--bootstrap", cluster.mock[0].address] if bootstrap == "given"
             else ["--kafka-port", str(cluster.mock[0].port)])  # fmt: skip
    up = ManagedProcess(
        [
            sys.executable, "-m", "kafkatunnel", "up", "--via", "kubectl", "-n", "kafka",
            *where, "--listen", f"127.0.0.1:{free_port_run(8)}", "--no-table",
        ],
        name="kafkatunnel-up",
        env={"KAFKATUNNEL_STATE_DIR": str(tmp_path)},
    )  # fmt: skip
    try:
        up.wait_for_line(r"^broker 3: ", timeout=30)

        def port_forwards() -> list[int]:
            listing = subprocess.run(
                ["ps", "-ww", "-eo", "pid,ppid,args"], capture_output=True, text=True
            ).stdout.splitlines()
            return [
                int(line.split()[0])
                for line in listing
                if "port-forward pod/kafka-" in line and int(line.split()[1]) == up.pid
            ]

        children = wait_for(
            lambda: (pids := port_forwards()) and len(pids) == 3 and pids,
            timeout=15,
            what="one kubectl port-forward per broker",
        )
        os.kill(up.pid, signal.SIGKILL)
        wait_for(
            lambda: not any(pid_alive(pid) and _not_zombie(pid) for pid in children),
            timeout=10,
            what="the port-forwards to die with the tunnel",
        )
    finally:
        up.stop()


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_hostile_names_through_kubectl_forwards(
    cluster: LocalCluster, world: World, tmp_path: Path
) -> None:
    """--via kubectl meets a cluster whose Metadata answers name hostile brokers (the
    filter sits in each forward's stream, as the cluster would be behind it): they get no
    port-forward, clients are told they do not resolve, every group still works. (No
    command here takes a broker's name as text: the shell case is test_trust's.)"""
    from kafkatunnel.demo.processes import ManagedProcess
    from kafkatunnel.probe import ProbeConnection
    from tests.tunnel.hostile import filter_argv, hostile_names

    spec = tmp_path / "hostile.json"
    spec.write_text(json.dumps({"brokers": hostile_names(str(tmp_path / "p"))}))
    world(stream_prefix=filter_argv(str(spec)))
    port = free_port_run(8)
    root = str(Path(__file__).resolve().parents[2])
    tunnel = ManagedProcess(
        [sys.executable, "-m", "kafkatunnel", "up", "--via", "kubectl", "-n", "kafka",
         "--kafka-port", str(cluster.mock[0].port), "--listen", f"127.0.0.1:{port}",
         "--no-table"],
        name="kafkatunnel-up", env={"KAFKATUNNEL_STATE_DIR": str(tmp_path), "PYTHONPATH": root},
    )  # fmt: skip
    try:
        tunnel.wait_for_line(r"^broker 104: ", timeout=60)
        refusals = [line for line in tunnel.lines if "refused broker" in line]
        assert len(refusals) == 1 and "and 2 more" in refusals[0], refusals
        with ProbeConnection(f"127.0.0.1:{port}") as probe:
            told = {b.node_id: b.host for b in probe.brokers()}
        assert all(told[n].endswith(".kafkatunnel.invalid") for n in (101, 102, 103)), told
        forwards = [line for line in tunnel.lines if "pod/" in line and "refused" not in line]
        assert not [f for f in forwards if "ProxyCommand" in f or "evil" in f], forwards
        every_group_works(cluster, f"127.0.0.1:{port}", f"kube-hostile-{uuid.uuid4().hex[:6]}")
    finally:
        tunnel.stop()


def test_a_kubectl_that_hangs_never_outlives_its_call(tmp_path: Path) -> None:
    """A kubectl that does not answer is killed and reaped, whether its call times out (a
    KubectlError naming the fix, for can-i too) or is cancelled (up stopping)."""
    hanging = tmp_path / "kubectl"
    pids = tmp_path / "pids"
    hanging.write_text(f"#!/bin/sh\necho $$ >> {pids}\nexec sleep 600\n")
    hanging.chmod(0o755)
    kubectl = Kubectl(binary=str(hanging))

    async def cancelled() -> None:
        call = asyncio.ensure_future(kubectl.run("get", "pods"))
        deadline = time.monotonic() + 10
        while not pids.exists():  # kubectl has started
            assert time.monotonic() < deadline, "the hanging kubectl never started"
            await asyncio.sleep(0.02)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    async def timed_out() -> None:
        with pytest.raises(KubectlError, match=r"did not answer within 0.5s"):
            await kubectl.run("get", "pods", timeout=0.5)
        with pytest.raises(KubectlError, match=r"kubectl auth can-i list pods"):
            await kubectl.can_i("list", "pods", timeout=0.5)

    asyncio.run(cancelled())
    asyncio.run(timed_out())
    started = [int(pid) for pid in pids.read_text().split()]
    assert len(started) == 3
    for pid in started:
        with pytest.raises(ProcessLookupError):  # killed and reaped: no zombie either
            os.kill(pid, 0)
