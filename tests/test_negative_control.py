"""The failure kafkatunnel exists to remove, reproduced on the isolated cluster.

Every advertised broker address is forwarded to one broker (one `kubectl port-forward`
plus hosts entries). A group whose coordinator is that broker consumes everything; a group
coordinated by any other broker gets NOT_COORDINATOR and consumes nothing.
"""

from __future__ import annotations

import socket
import uuid

import pytest

from kafkatunnel.demo import LocalCluster
from kafkatunnel.demo.single_forward import SingleForward
from kafkatunnel.demo.workload import consume_group

MESSAGES = 20


def test_advertised_addresses_are_unreachable_from_the_host(cluster: LocalCluster) -> None:
    assert cluster.isolated
    for broker in cluster.mock:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", broker.port), timeout=1).close()
        cluster.connect(broker.host, broker.port).close()  # but reachable inside


def test_single_forward_gives_not_coordinator(cluster: LocalCluster) -> None:
    topic = f"control-{uuid.uuid4().hex[:8]}"
    leader = cluster.broker(cluster.partition_leaders(topic)[0])
    assert cluster.produce_inside(topic, MESSAGES, partition=0) == MESSAGES
    spread = cluster.groups_by_coordinator(1, prefix=f"{topic}-group")
    working_group = spread[leader.node_id][0]
    failing_group = next(groups[0] for node, groups in spread.items() if node != leader.node_id)

    with SingleForward(cluster, leader):
        failing = consume_group(
            leader.address,
            failing_group,
            topic,
            MESSAGES,
            timeout=30,
            stop_after_coordinator_errors=3,
        )
        working = consume_group(leader.address, working_group, topic, MESSAGES, timeout=30)

    assert failing.consumed == 0
    assert failing.not_coordinator >= 3, failing.coordinator_errors
    assert any("JoinGroup error: Broker: Not coordinator" in e for e in failing.coordinator_errors)
    assert working.consumed == MESSAGES
    assert sorted(working.values) == sorted(f"m-{i}".encode() for i in range(MESSAGES))
    assert working.not_coordinator == 0
