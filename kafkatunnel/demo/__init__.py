"""What `kafkatunnel demo` runs: an isolated local Kafka cluster (a librdkafka mock cluster
and a tansu broker in a network namespace, or Apache Kafka itself), the single forward that
shows the problem, the client workloads, and the demo's steps. The tests and the benchmarks
run on the same cluster."""

from kafkatunnel.demo.harness import (
    TANSU_HOST,
    ClusterBroker,
    LocalCluster,
)
from kafkatunnel.demo.netns import IsolationUnavailable, isolation_problem
from kafkatunnel.demo.ports import free_port, free_port_run

__all__ = [
    "TANSU_HOST",
    "ClusterBroker",
    "IsolationUnavailable",
    "LocalCluster",
    "free_port",
    "free_port_run",
    "isolation_problem",
]
