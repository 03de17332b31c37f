"""A tunnel through the kubectl stand-in, its forwards, the faults the stand-in injects, and
a workload (an idempotent producer and a consumer per group) that runs through them and then
says what was acknowledged, what reached the log and what each group processed."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.demo.workload import GroupResult, consume_group, consume_groups, produce
from kafkatunnel.kube.forwarder import KubectlForwarder
from kafkatunnel.kube.kubectl import Kubectl
from kafkatunnel.kube.portforward import PortForward
from kafkatunnel.tunnel import TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel
from kafkatunnel.waiting import wait_for


def kube_tunnel(cluster: LocalCluster, **kube: object) -> BackgroundTunnel:
    forwarder = KubectlForwarder(Kubectl(namespace="kafka"), **kube)  # type: ignore[arg-type]
    config = TunnelConfig(
        bootstrap=cluster.mock[0].address, listen_port=free_port_run(8), control=False
    )
    return BackgroundTunnel(config, forwarder).start()


def every_group_works(cluster: LocalCluster, bootstrap: str, topic: str) -> None:
    """40 messages produced through the tunnel at `bootstrap`, and consumed by a group per
    coordinator without a coordinator error."""
    assert produce(bootstrap, topic, 40) == 40
    groups = {gs[0]: 40 for gs in cluster.groups_by_coordinator(1, prefix=f"{topic}-g").values()}
    results = consume_groups(bootstrap, groups, topic, timeout=60)
    for group, result in results.items():
        assert result.consumed == 40 and result.coordinator_errors == [], (group, result)


def ready_routes(tunnel: BackgroundTunnel) -> dict[int, str] | None:
    brokers = tunnel.status()["endpoints"][1:]
    if brokers and all("(ready)" in e["route"] for e in brokers):
        return {e["node_id"]: e["route"] for e in brokers}
    return None


def forward_of(tunnel: BackgroundTunnel, pod: str) -> PortForward:
    forwarder = tunnel.tunnel.forwarder
    assert isinstance(forwarder, KubectlForwarder)
    return next(f for f in forwarder.forwards.values() if f.pod == pod)


def settled(forward: PortForward) -> Callable[[], bool]:
    """Up for longer than the supervisor's healthy_after, so a new kill starts backoff anew."""

    def check() -> bool:
        return forward.ready_since is not None and time.monotonic() - forward.ready_since > 1.2

    return check


def restarted(forward: PortForward, old_pid: int) -> Callable[[], bool]:
    def check() -> bool:
        process = forward.process
        return process is not None and process.pid != old_pid and forward.local_port is not None

    return check


def world_file(suffix: str) -> Path:
    return Path(f"{os.environ['KUBECTL_STANDIN_WORLD']}.{suffix}")


def make_zombie(pod: str, mode: str) -> None:
    """Turn the pod's running port-forward into a zombie of that kind; return once it has
    (the stand-in claims the file)."""
    order = world_file(f"zombie-{pod}")
    order.write_text(mode)
    wait_for(lambda: not order.exists(), timeout=5, what=f"kubectl for {pod} to turn {mode}")


def lid_closes(forwards: list[PortForward]) -> None:
    """Every running port-forward loses its API server, as over a laptop's sleep; return once
    each of these has (a wake noticed before a stand-in stalled would find it healthy)."""
    world_file("stall").touch()
    pids = [forward.process.pid for forward in forwards if forward.process is not None]
    assert len(pids) == len(forwards), "a forward without a running kubectl"
    wait_for(
        lambda: all(world_file(f"stalled-{pid}").exists() for pid in pids),
        timeout=5,
        what="every kubectl to lose its API server",
    )


@dataclass
class FaultRun:
    acknowledged: set[bytes]  # every message the producer was told is stored
    failed: int  # messages the producer gave up on
    restore_times: list[float]
    results: dict[str, GroupResult]
    log: GroupResult
    log_size: int


Inject = Callable[[Callable[[], int]], list[float]]


def run_under_faults(
    tunnel: BackgroundTunnel, groups: list[str], topic: str, inject: Inject
) -> FaultRun:
    """An idempotent producer (acks=all) and a consumer per group run while `inject` does
    its faults (returning how long each took to recover; it is given the count of messages
    acknowledged so far, to wait for the workload to move). Then the producer flushes, the
    log is read back by a fresh group, and each group finishes from its committed offsets."""
    import confluent_kafka

    acknowledged: set[bytes] = set()
    failed = [0]
    stop = threading.Event()

    def on_delivery(error: object, message: confluent_kafka.Message) -> None:
        if error is None:
            acknowledged.add(message.value() or b"")
        else:
            failed[0] += 1

    def producer() -> None:
        p = confluent_kafka.Producer({
            "bootstrap.servers": tunnel.bootstrap_servers, "enable.idempotence": True,
            "acks": "all", "linger.ms": 5,
        })  # fmt: skip
        sent = 0
        while not stop.is_set():
            p.produce(topic, f"m-{sent}".encode(), on_delivery=on_delivery)
            sent += 1
            p.poll(0)
            time.sleep(0.02)
        failed[0] += p.flush(120)

    results: dict[str, GroupResult] = {}

    def consumers() -> None:
        results.update(consume_groups(tunnel.bootstrap_servers, dict.fromkeys(groups, 10**9),
                                      topic, timeout=600, dedupe_by_offset=True,
                                      stop=stop))  # fmt: skip

    raised: list[BaseException] = []

    def reporting(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as error:  # the test fails with it, below
                raised.append(error)

        return run

    threads = [threading.Thread(target=reporting(producer)),
               threading.Thread(target=reporting(consumers))]  # fmt: skip
    for t in threads:
        t.start()
    try:
        restore_times = inject(lambda: len(acknowledged))
    finally:
        stop.set()
        for t in threads:
            t.join(300)
    if raised:
        raise raised[0]
    assert set(results) == set(groups), (sorted(results), groups)
    size = log_size(tunnel.bootstrap_servers, topic)
    # the reader and each group's rest at once: each is a join of its own (3 s on the mock)
    with ThreadPoolExecutor(len(results) + 1) as pool:
        reading = pool.submit(consume_group, tunnel.bootstrap_servers, f"{topic}-reader", topic,
                              size, timeout=120)  # fmt: skip
        # each group's rest skips what its first part processed: a final commit refused
        # there (FENCED, the group rebalancing at the stop) has it delivered again here
        rests = {group: pool.submit(consume_group, tunnel.bootstrap_servers, group, topic,
                                    size - len(first.values), timeout=120,
                                    dedupe_by_offset=True, processed_before=first.processed)
                 for group, first in results.items()}  # fmt: skip
        log = reading.result()
    finished = {}
    for group, first in results.items():
        rest = rests[group].result()
        first.values += rest.values  # from the group's committed offsets, after the faults
        first.redelivered += rest.redelivered
        finished[group] = first
    return FaultRun(acknowledged, failed[0], restore_times, finished, log, size)


def log_size(bootstrap: str, topic: str) -> int:
    import confluent_kafka

    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "sizer"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        marks = [
            consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=30)
            for p in partitions
        ]
        return sum(high - low for low, high in marks)
    finally:
        consumer.close()
