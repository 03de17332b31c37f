"""Different clients and producer modes through the tunnel, and the tansu broker with its
Kubernetes-style advertised name."""

from __future__ import annotations

import asyncio
import re
import subprocess
import uuid

import confluent_kafka

from kafkatunnel.demo import TANSU_HOST, LocalCluster
from kafkatunnel.demo.workload import consume_group, produce
from kafkatunnel.hostnames import split_address
from kafkatunnel.probe import ProbeConnection, find_coordinator
from tests.tunnel.conftest import MakeTunnel


def _tunnel_port(bootstrap: str, host: str, port: int) -> bool:
    base_host, base_port = split_address(bootstrap)
    return host == base_host and base_port < port <= base_port + 16


def test_tansu_with_a_kubernetes_name(cluster: LocalCluster, make_tunnel: MakeTunnel) -> None:
    assert cluster.tansu is not None and cluster.tansu.host == TANSU_HOST
    tunnel = make_tunnel(bootstrap=cluster.tansu.address)
    bootstrap = tunnel.bootstrap_servers
    topic = f"tansu-{uuid.uuid4().hex[:6]}"
    assert produce(bootstrap, topic, 50) == 50
    result = consume_group(bootstrap, f"{topic}-group", topic, 50, timeout=60)
    assert sorted(result.values) == sorted(f"m-{i}".encode() for i in range(50))
    assert result.coordinator_errors == []
    with ProbeConnection(bootstrap) as probe:
        brokers = probe.brokers()
        described = probe.describe_cluster()
    for broker in brokers + described:
        assert _tunnel_port(bootstrap, broker.host, broker.port), broker
    assert len(described) == 1


def test_debians_kcat_reaches_tansu_through_the_tunnel(
    cluster: LocalCluster, make_tunnel: MakeTunnel
) -> None:
    """Debian 12's kcat has librdkafka 2.0.2, which cannot parse tansu's ApiVersions answer
    (every default tagged field written; librdkafka#4278). Through the tunnel it lists the
    brokers and consumes as a group, as the quickstart shows."""
    assert cluster.tansu is not None
    tunnel = make_tunnel(bootstrap=cluster.tansu.address)
    bootstrap = tunnel.bootstrap_servers
    topic = f"kcat-{uuid.uuid4().hex[:6]}"
    assert produce(bootstrap, topic, 5) == 5
    listed = subprocess.run(["kcat", "-b", bootstrap, "-L", "-m", "10"], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    listed_at = re.findall(r"broker \d+ at (\S+):(\d+)", listed.stdout)
    assert listed_at, listed.stdout
    assert all(_tunnel_port(bootstrap, host, int(port)) for host, port in listed_at)
    consumed = subprocess.run(
        # tansu answers a JoinGroup once half the member's session timeout has passed:
        # 6 s, not librdkafka's 45 s default, so the join takes 3 s rather than 22
        ["kcat", "-b", bootstrap, "-X", "session.timeout.ms=6000", "-G", f"{topic}-g", "-e",
         "-o", "beginning", topic],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.split()) == sorted(f"m-{i}" for i in range(5))


def test_aiokafka(cluster: LocalCluster, make_tunnel: MakeTunnel) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    tunnel = make_tunnel()
    topic = f"aio-{uuid.uuid4().hex[:6]}"
    groups = [
        g for gs in cluster.groups_by_coordinator(1, prefix=f"{topic}-g").values() for g in gs
    ]

    async def run() -> dict[str, list[bytes]]:
        producer = AIOKafkaProducer(bootstrap_servers=tunnel.bootstrap_servers)
        await producer.start()
        try:
            for i in range(30):
                await producer.send_and_wait(topic, f"a-{i}".encode())
        finally:
            await producer.stop()
        seen: dict[str, list[bytes]] = {}
        for group in groups:
            consumer = AIOKafkaConsumer(
                topic,
                bootstrap_servers=tunnel.bootstrap_servers,
                group_id=group,
                auto_offset_reset="earliest",
            )
            await consumer.start()
            try:
                values: list[bytes] = []
                async with asyncio.timeout(60):
                    while len(values) < 30:
                        batch = await consumer.getmany(timeout_ms=500)
                        values += [m.value or b"" for records in batch.values() for m in records]
                await consumer.commit()
            finally:
                await consumer.stop()
            seen[group] = values
        return seen

    seen = asyncio.run(run())
    assert len(seen) == 3
    for group, values in seen.items():
        assert sorted(values) == sorted(f"a-{i}".encode() for i in range(30)), group


def test_idempotent_producer(cluster: LocalCluster, make_tunnel: MakeTunnel) -> None:
    tunnel = make_tunnel()
    topic = f"idem-{uuid.uuid4().hex[:6]}"
    config = {"enable.idempotence": True, "acks": "all"}
    assert produce(tunnel.bootstrap_servers, topic, 300, config=config) == 300
    result = consume_group(tunnel.bootstrap_servers, f"{topic}-g", topic, 300, timeout=60)
    assert sorted(result.values) == sorted(f"m-{i}".encode() for i in range(300))


def test_transactional_producer_is_routed_to_its_coordinator(
    cluster: LocalCluster, make_tunnel: MakeTunnel
) -> None:
    tunnel = make_tunnel()
    bootstrap = tunnel.bootstrap_servers
    topic = f"txn-{uuid.uuid4().hex[:6]}"
    produce(bootstrap, topic, 1, prefix="warm")  # the topic exists before the transaction
    transactional_ids = []
    with ProbeConnection(bootstrap) as probe:
        nodes: dict[int, str] = {}
        index = 0
        while len(nodes) < 3 and index < 500:
            key = f"{topic}-tx-{index}"
            coordinator = probe.find_coordinator(key, transactional=True)
            assert _tunnel_port(bootstrap, coordinator.host, coordinator.port)
            nodes.setdefault(coordinator.node_id, key)
            index += 1
        transactional_ids = list(nodes.values())
    assert len(transactional_ids) == 3  # one per coordinator

    for transactional_id in transactional_ids:
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": transactional_id}
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        for i in range(10):
            producer.produce(topic, f"{transactional_id}-{i}".encode())
        producer.commit_transaction(30)
        coordinator = find_coordinator(bootstrap, transactional_id, transactional=True)
        assert coordinator.error_code == 0

    result = consume_group(
        bootstrap, f"{topic}-reader", topic, 31, timeout=60,
        config={"isolation.level": "read_committed"},
    )  # fmt: skip
    committed = sorted(v for v in result.values if not v.startswith(b"warm"))
    assert committed == sorted(f"{t}-{i}".encode() for t in transactional_ids for i in range(10))


def test_brokers_learned_from_client_traffic(
    cluster: LocalCluster, make_tunnel: MakeTunnel
) -> None:
    """Without discovery at start, the client's own Metadata answer creates the listeners
    before the client reads it: the client never meets an address that is not listening."""
    tunnel = make_tunnel(discover_at_start=False)
    assert tunnel.status()["endpoints"][1:] == []
    topic = f"lazy-{uuid.uuid4().hex[:6]}"
    assert produce(tunnel.bootstrap_servers, topic, 20) == 20
    endpoints = tunnel.status()["endpoints"][1:]
    assert sorted(e["node_id"] for e in endpoints) == [1, 2, 3]
    assert all(e["state"] == "listening" and e["errors"] == 0 for e in endpoints)
    ports = [split_address(e["tunnel"])[1] for e in endpoints]
    base = split_address(tunnel.bootstrap_servers)[1]
    assert ports == [base + 1, base + 2, base + 3]  # node-id order
