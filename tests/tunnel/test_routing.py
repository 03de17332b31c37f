"""The product: through the tunnel every consumer group works, whichever broker coordinates
it, and every broker address a client is told is a tunnel address."""

from __future__ import annotations

import uuid

import pytest

from kafkatunnel.demo import LocalCluster
from kafkatunnel.demo.single_forward import SingleForward
from kafkatunnel.demo.workload import consume_groups, produce
from kafkatunnel.hostnames import split_address
from kafkatunnel.probe import find_coordinator
from tests.tunnel.conftest import MakeTunnel

INSIDE, THROUGH = 40, 60


def test_groups_on_every_coordinator_fail_without_and_work_with_the_tunnel(
    cluster: LocalCluster, make_tunnel: MakeTunnel
) -> None:
    topic = f"route-{uuid.uuid4().hex[:8]}"
    leader = cluster.broker(cluster.partition_leaders(topic)[0])
    assert cluster.produce_inside(topic, INSIDE, partition=0) == INSIDE
    spread = cluster.groups_by_coordinator(2, prefix=f"{topic}-g")
    groups = [g for node in sorted(spread) for g in spread[node]]
    assert len(groups) == 6 and len(spread) == 3

    with SingleForward(cluster, leader):
        without = consume_groups(
            leader.address,
            dict.fromkeys(groups, INSIDE),
            topic,
            timeout=30,
            stop_after_coordinator_errors=3,
        )
    for node, node_groups in spread.items():
        for g in node_groups:
            if node == leader.node_id:
                assert without[g].consumed == INSIDE and without[g].not_coordinator == 0
            else:
                assert without[g].consumed == 0 and without[g].not_coordinator >= 3, g

    tunnel = make_tunnel()
    assert produce(tunnel.bootstrap_servers, topic, THROUGH, prefix="t") == THROUGH
    expected = sorted(
        [f"m-{i}".encode() for i in range(INSIDE)] + [f"t-{i}".encode() for i in range(THROUGH)]
    )
    committed_before = set(spread[leader.node_id])  # these consumed the first 40 already
    wanted = {g: THROUGH if g in committed_before else INSIDE + THROUGH for g in groups}
    results = consume_groups(tunnel.bootstrap_servers, wanted, topic, timeout=60)
    for g, result in results.items():
        assert result.coordinator_errors == [], (g, result.coordinator_errors[:3])
        if g in committed_before:
            assert sorted(result.values) == expected[INSIDE:], g
        else:
            assert sorted(result.values) == expected, g


def _is_tunnel(tunnel_bootstrap: str, host: str, port: int) -> bool:
    base_host, base_port = split_address(tunnel_bootstrap)
    return host == base_host and base_port < port <= base_port + 16


def test_clients_see_only_tunnel_addresses(cluster: LocalCluster, make_tunnel: MakeTunnel) -> None:
    import confluent_kafka

    tunnel = make_tunnel()
    bootstrap = tunnel.bootstrap_servers
    topic = f"addr-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, topic, 1)

    metadata = confluent_kafka.Producer({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    assert len(metadata.brokers) == 3
    for broker in metadata.brokers.values():
        assert _is_tunnel(bootstrap, broker.host, broker.port), broker

    # DescribeCluster: the mock cluster does not implement it; tansu's test covers it.

    for group in ("g1", "g3", "consumer0"):
        coordinator = find_coordinator(bootstrap, group)
        assert coordinator.error_code == 0
        assert _is_tunnel(bootstrap, coordinator.host, coordinator.port), coordinator
    advertised = {b.port for b in cluster.mock}
    assert not any(b.port in advertised for b in metadata.brokers.values())


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks(cluster: LocalCluster, make_tunnel: MakeTunnel, acks: str) -> None:
    tunnel = make_tunnel()
    topic = f"acks-{acks}-{uuid.uuid4().hex[:6]}"
    delivered = produce(tunnel.bootstrap_servers, topic, 200, config={"acks": acks})
    assert delivered == 200
    groups = {gs[0]: 200 for gs in cluster.groups_by_coordinator(1, prefix=f"{topic}-g").values()}
    results = consume_groups(tunnel.bootstrap_servers, groups, topic, timeout=60)
    for result in results.values():
        if acks != "0":
            assert result.consumed == 200
        else:
            # acks=0 gives no delivery guarantee, but nothing waits on the tunnel either:
            # the proxied connection must not hold an entry per unanswered request.
            assert result.consumed > 0
        assert result.coordinator_errors == []
