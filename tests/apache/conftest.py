"""One Apache Kafka cluster for every test that needs it: they all live in this package,
so the cluster starts once per run and its three JVMs stop as soon as these tests end,
not idling beside the rest of the suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafkatunnel.localcluster import isolation_problem
from kafkatunnel.localcluster.apache import ApacheKafka


@pytest.fixture(scope="package")
def apache_kafka() -> Iterator[ApacheKafka]:
    """Apache Kafka, three KRaft nodes in a network of their own."""
    problem = isolation_problem()
    if problem:
        pytest.skip(f"needs network isolation, which is unavailable: {problem}")
    with ApacheKafka() as kafka:
        yield kafka
