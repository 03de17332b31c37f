"""The broker registry's refusals, without a cluster: what a repeated or hostile answer
costs in memory, counts and log lines."""

from __future__ import annotations

import logging

import pytest

from kafkatunnel.protocol import BrokerAddress
from kafkatunnel.tunnel.registry import REFUSED_REMEMBERED, BrokerRegistry, refused_address

pytestmark = pytest.mark.quick


def test_a_repeated_answer_is_refused_once(caplog: pytest.LogCaptureFixture) -> None:
    """Clients refresh metadata every few minutes: the same refused brokers must not be
    counted or logged again each time."""
    registry = BrokerRegistry("127.0.0.1", 19092, max_brokers=2)
    answer = [BrokerAddress(n, f"kafka-{n}.example", 9092) for n in range(1, 6)]
    answer.append(BrokerAddress(9, "bad name", 9092))
    with caplog.at_level(logging.ERROR, "kafkatunnel.registry"):
        for _ in range(3):
            registry.learn(answer)
    assert sorted(registry.brokers) == [1, 2]
    assert registry.refused_total == 4  # 3, 4, 5 past the limit; 9 for its name
    assert len([r for r in caplog.records if "refused broker" in r.getMessage()]) == 1
    assert registry.map(answer[-1]) == refused_address(answer[-1])
    assert registry.map(answer[0]) == ("127.0.0.1", 19093)


def test_a_flood_of_refused_ids_is_remembered_only_so_far() -> None:
    registry = BrokerRegistry("127.0.0.1", 19092, max_brokers=1)
    flood = [BrokerAddress(n, "x y", 9092) for n in range(REFUSED_REMEMBERED + 500)]
    registry.learn(flood)
    assert len(registry.refusals) <= 50
    assert registry.refused_total == len(flood)
    assert len(registry._refused_ids) == REFUSED_REMEMBERED
