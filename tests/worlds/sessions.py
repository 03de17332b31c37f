"""Recorded sessions on the local cluster: the tunnel acceptance workload recorded by
`--record`, and the single-forward control captured with dumpcap, on the demo's cluster.
The tests and scripts/record_samples.py share them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kafkatunnel.capture.dumpcap import Dumpcap
from kafkatunnel.demo.harness import LocalCluster
from kafkatunnel.demo.ports import free_port_run
from kafkatunnel.demo.single_forward import SingleForward
from kafkatunnel.demo.workload import (
    GroupResult,
    consume_groups,
    produce,
    produce_transaction,
)
from kafkatunnel.probe import ProbeConnection
from kafkatunnel.tunnel import ExecForwarder, TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel


@dataclass
class Workload:
    topic: str
    groups: dict[str, int]  # group -> node id of its coordinator
    messages: int = 20
    transactions: int = 5  # messages in each transactional id's transaction
    transactional_ids: list[str] = field(default_factory=list)


def spread_workload(cluster: LocalCluster, topic: str, per_broker: int = 2) -> Workload:
    spread = cluster.groups_by_coordinator(per_broker, prefix=f"{topic}-g")
    return Workload(topic, {g: node for node, groups in spread.items() for g in groups})


def transactional_ids(bootstrap: str, prefix: str, count: int = 3) -> dict[str, int]:
    """Transactional ids, one per transaction coordinator: id -> node id."""
    with ProbeConnection(bootstrap) as probe:
        found = probe.keys_by_coordinator(f"{prefix}-tx", count, transactional=True)
    return {coordinator.key: node for node, coordinator in found.items()}


def capture_single_forward(
    cluster: LocalCluster, work: Workload, path: Path, timeout: float = 20.0
) -> dict[str, GroupResult]:
    """The groups consume through one forward for every broker, captured on loopback.
    Needs isolation; `work.topic` must hold `work.messages` messages in its partition 0."""
    leader = cluster.broker(cluster.partition_leaders(work.topic)[0])
    ports = [broker.port for broker in cluster.mock]
    with Dumpcap(path, ports), SingleForward(cluster, leader):
        return consume_groups(leader.address, dict.fromkeys(work.groups, work.messages),
                              work.topic, timeout=timeout,
                              stop_after_coordinator_errors=3)  # fmt: skip


def record_routed_session(
    cluster: LocalCluster,
    work: Workload,
    directory: Path,
    already: int = 0,
    rotate_bytes: int = 64 * 1024 * 1024,
    timeout: float = 40.0,
    committed: dict[str, int] | None = None,
) -> dict[str, GroupResult]:
    """Through a recording tunnel: an idempotent producer, one transaction per transaction
    coordinator, and every group consuming all of it. `already`: messages in the topic;
    `committed`: how many of them a group consumed and committed before."""
    config = TunnelConfig(
        bootstrap=cluster.mock[0].address,
        listen_port=free_port_run(8),
        control=False,
        record_dir=directory,
        record_rotate_bytes=rotate_bytes,
    )
    with BackgroundTunnel(config, ExecForwarder(cluster.exec_template())) as tunnel:
        bootstrap = tunnel.bootstrap_servers
        produce(bootstrap, work.topic, work.messages, prefix="t",
                config={"enable.idempotence": True, "acks": "all"})  # fmt: skip
        work.transactional_ids = list(transactional_ids(bootstrap, work.topic))
        for transactional_id in work.transactional_ids:
            produce_transaction(bootstrap, work.topic, transactional_id, work.transactions)
        total = already + work.messages + work.transactions * len(work.transactional_ids)
        done = committed or {}
        expected = {group: total - done.get(group, 0) for group in work.groups}
        return consume_groups(bootstrap, expected, work.topic, timeout=timeout)
