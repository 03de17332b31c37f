"""kubectl port-forwards that stay alive and stop working, as users meet them: after the pod
restarted (kubectl#686), after many interrupted connections (kubernetes#78446), after the
pod is gone (kubernetes#67059), and after the laptop slept (docker/cli#2436). The stand-in
copies each one's lines and timing (tests/kube/bin/kubectl); the tests that take `kubectl`
also run with the real kubectl, its API server failing the same way (the sleep under load
runs once, with the real one where there is one: one_kubectl). The tunnel must notice,
replace the forward, say why, and lose nothing a client was told is stored."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from kafkatunnel.demo import LocalCluster
from kafkatunnel.demo.workload import consume_group, produce
from kafkatunnel.kube.forwarder import KubectlForwarder
from kafkatunnel.kube.portforward import PortForward
from kafkatunnel.probe import ProbeConnection
from kafkatunnel.tunnel.background import BackgroundTunnel
from kafkatunnel.waiting import wait_for
from tests.kube.conftest import World
from tests.kube.faults import (
    forward_of,
    kube_tunnel,
    lid_closes,
    make_zombie,
    ready_routes,
    restarted,
    run_under_faults,
    settled,
)

KINDS = ("timeout", "forwarding-timeout", "gone")
RECOVERY = 15.0  # seconds from the fault to a broker usable through the tunnel again


def _answers(tunnel: BackgroundTunnel, node: int) -> bool:
    """A new client connection to the broker's tunnel address gets ApiVersions answered."""
    endpoint = next(e for e in tunnel.status()["endpoints"] if e["node_id"] == node)
    try:
        with ProbeConnection(endpoint["tunnel"], 2.0) as probe:
            probe.api_versions()
    except (OSError, ValueError):
        return False
    return True


def _replaced_in_status(tunnel: BackgroundTunnel, pod: str, count: int | None = None) -> bool:
    """The status table says the pod's forward was replaced (`count` times) and why."""
    said = f"[{count} replaced; last: " if count is not None else " replaced; last: "
    return any(f"pod/{pod} " in e["route"] and said in e["route"]
               for e in tunnel.status()["endpoints"])  # fmt: skip


@pytest.mark.parametrize("mode", ["gone", "timeout"])
def test_a_forward_alive_but_useless_is_replaced_while_idle(
    cluster: LocalCluster, world: World, mode: str
) -> None:
    """No client at all: "gone" is found by the first client's connection failing (kubectl's
    line, or the connection closed unanswered, whichever the tunnel sees first); "timeout"
    by the periodic check, before any client."""
    tunnel = kube_tunnel(cluster, keepalive=60.0 if mode == "gone" else 1.0)
    try:
        wait_for(lambda: ready_routes(tunnel), timeout=15, what="a ready forward each")
        topic = f"zombie-{uuid.uuid4().hex[:6]}"
        leaders = set(cluster.partition_leaders(topic).values())  # the producer meets these
        index = next(i for i, b in enumerate(cluster.mock) if b.node_id in leaders)
        pod = f"kafka-{index}"
        forward = forward_of(tunnel, pod)
        assert forward.process is not None
        pid = forward.process.pid
        make_zombie(pod, mode)
        if mode == "gone":  # a client meets it first
            assert produce(tunnel.bootstrap_servers, topic, 30) == 30
        wait_for(restarted(forward, pid), timeout=20, what="the useless forward to be replaced")
        assert forward.replacements == 1 and forward.process is not None
        assert forward.process.returncode is None  # the new kubectl runs, the old is gone
        expected = (("kubectl said: ", "a connection closed before any answer") if mode == "gone"
                    else ("no answer to ApiVersions within 5s after periodic check",))  # fmt: skip
        reason = forward.last_replacement or ""
        assert any(e in reason for e in expected), reason
        assert _replaced_in_status(tunnel, pod, 1)
        assert produce(tunnel.bootstrap_servers, f"{topic}-after", 30) == 30
        group = next(iter(cluster.groups_by_coordinator(1, prefix=f"{topic}-g").values()))[0]
        assert consume_group(tunnel.bootstrap_servers, group, f"{topic}-after", 30,
                             timeout=60).consumed == 30  # fmt: skip
        node = cluster.mock[index].node_id
        replaced = [
            line
            for line in tunnel.tunnel.metrics().splitlines()
            if line.startswith(f'kafkatunnel_forward_replacements_total{{node="{node}"')
        ]
        assert replaced and replaced[0].endswith(" 1"), replaced  # fmt: skip
    finally:
        tunnel.stop()


def test_each_zombie_kind_twice_under_load(
    cluster: LocalCluster, world: World, request: pytest.FixtureRequest
) -> None:
    """An idempotent producer and three groups, one per coordinator, run while each zombie
    kind strikes twice, on different brokers. The periodic check is an hour away: what finds
    them is kubectl's lines and connections through the forward that close unanswered or get
    no answer. Each broker answers a new connection through the tunnel within 15 s of its
    zombie starting; status names the replacement and its reason; every acknowledged message
    is in the log and every group processes the whole log."""
    tunnel = kube_tunnel(cluster, keepalive=3600.0)
    request.addfinalizer(tunnel.stop)
    wait_for(lambda: ready_routes(tunnel), timeout=15, what="a ready forward each")
    topic = f"zombies-{uuid.uuid4().hex[:6]}"
    groups = [gs[0] for gs in cluster.groups_by_coordinator(1, prefix=f"{topic}-g").values()]
    strikes = [(kind, f"kafka-{(i + round_) % 3}") for round_ in range(2)
               for i, kind in enumerate(KINDS)]  # fmt: skip
    reasons: list[str] = []

    def zombies(acknowledged: Callable[[], int]) -> list[float]:
        times = []
        for kind, pod in strikes:
            forward = forward_of(tunnel, pod)
            wait_for(settled(forward), timeout=30, what=f"{pod}'s forward to be up and settled")
            _moving(acknowledged)
            before = forward.replacements
            started = time.monotonic()
            make_zombie(pod, kind)
            _recovered(tunnel, forward, before, _node_of(cluster, pod), f"{kind} on {pod}")
            times.append(time.monotonic() - started)
            assert _replaced_in_status(tunnel, pod)
            reasons.append(f"{kind}: {forward.last_replacement}")
        return times

    run = run_under_faults(tunnel, groups, topic, zombies)
    assert max(run.restore_times) < RECOVERY, list(zip(strikes, run.restore_times, strict=True))
    assert len(reasons) == 6 and all(": " in r for r in reasons), reasons
    assert run.failed == 0 and run.acknowledged
    assert run.log.consumed == run.log_size
    assert set(run.log.values) == run.acknowledged  # nothing acknowledged is lost
    for group, result in run.results.items():
        assert sorted(result.values) == sorted(run.log.values), (group, len(result.values))


def _moving(acknowledged: Callable[[], int]) -> None:
    """Until the producer has more messages acknowledged: the workload runs."""
    now = acknowledged()
    wait_for(lambda: acknowledged() >= now + 20, timeout=60, what="the producer to move")


def _recovered(
    tunnel: BackgroundTunnel, forward: PortForward, before: int, node: int, fault: str
) -> None:
    """Until a new connection (a client trying, every 2 s) is answered by the broker, and
    the forward was replaced: a zombie that kept its open streams shows only to new ones."""

    def usable() -> bool:
        answered = _answers(tunnel, node)
        return answered and forward.replacements > before

    wait_for(usable, timeout=30, what=f"broker {node} usable after {fault}")


def _node_of(cluster: LocalCluster, pod: str) -> int:
    return cluster.mock[int(pod.rsplit("-", 1)[1])].node_id


@pytest.mark.alone  # the wake's probe of each forward waits 5 s at most
def test_waking_from_sleep_checks_every_forward_at_once(
    cluster: LocalCluster, world: World, kubectl: str
) -> None:
    """The machine cannot sleep in a test, so its clock is told it did (CLOCK_BOOTTIME
    ahead of CLOCK_MONOTONIC by an hour): the forward that died meanwhile (kubectl alive,
    every connection timing out) is replaced at once, the others are left alone."""
    tunnel = kube_tunnel(cluster, keepalive=3600.0, sleep_check=0.2)
    try:
        wait_for(lambda: ready_routes(tunnel), timeout=15, what="a ready forward each")
        forwarder = tunnel.tunnel.forwarder
        assert isinstance(forwarder, KubectlForwarder)
        slept = [0.0]
        forwarder.asleep = lambda: slept[0]
        make_zombie("kafka-2", "timeout")
        dead = forward_of(tunnel, "kafka-2")
        assert dead.process is not None
        pid = dead.process.pid
        slept[0] = 3600.0  # the lid opens
        wait_for(restarted(dead, pid), timeout=15, what="the dead forward to be replaced")
        assert "waking from sleep" in (dead.last_replacement or ""), dead.last_replacement
        assert [forward_of(tunnel, p).replacements for p in ("kafka-0", "kafka-1")] == [0, 0]
        assert produce(tunnel.bootstrap_servers, f"woke-{uuid.uuid4().hex[:6]}", 20) == 20
    finally:
        tunnel.stop()


def test_a_laptop_that_slept_under_load(
    cluster: LocalCluster, world: World, one_kubectl: str, request: pytest.FixtureRequest
) -> None:
    """The lid closes with a producer and three groups running: every forward's streams
    stop moving bytes and new connections get nothing (kubectl alive, its API server
    connection dead), and the clock shows an hour asleep. Within 15 s of waking every
    broker answers through the tunnel again, with nothing acknowledged lost."""
    tunnel = kube_tunnel(cluster, keepalive=3600.0, sleep_check=0.2)
    request.addfinalizer(tunnel.stop)
    wait_for(lambda: ready_routes(tunnel), timeout=15, what="a ready forward each")
    forwarder = tunnel.tunnel.forwarder
    assert isinstance(forwarder, KubectlForwarder)
    slept = [0.0]
    forwarder.asleep = lambda: slept[0]
    topic = f"sleep-{uuid.uuid4().hex[:6]}"
    groups = [gs[0] for gs in cluster.groups_by_coordinator(1, prefix=f"{topic}-g").values()]
    pods = ["kafka-0", "kafka-1", "kafka-2"]

    def sleep_and_wake(acknowledged: Callable[[], int]) -> list[float]:
        forwards = [forward_of(tunnel, pod) for pod in pods]
        for forward in forwards:
            wait_for(settled(forward), timeout=30, what="the forwards to be up and settled")
        _moving(acknowledged)
        lid_closes(forwards)
        slept[0] = 3600.0  # the lid opens
        woke = time.monotonic()
        for pod, forward in zip(pods, forwards, strict=True):
            _recovered(tunnel, forward, 0, _node_of(cluster, pod), "waking")
        return [time.monotonic() - woke]

    run = run_under_faults(tunnel, groups, topic, sleep_and_wake)
    assert run.restore_times[0] < RECOVERY, run.restore_times
    for pod in pods:
        assert "waking from sleep" in (forward_of(tunnel, pod).last_replacement or "")
    assert run.failed == 0 and run.acknowledged
    assert set(run.log.values) == run.acknowledged  # nothing acknowledged is lost
    for group, result in run.results.items():
        assert sorted(result.values) == sorted(run.log.values), (group, len(result.values))
