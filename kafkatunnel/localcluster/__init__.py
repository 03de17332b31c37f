"""An isolated local Kafka cluster for the demo, the benchmarks and the tests."""

from kafkatunnel.localcluster.harness import (
    TANSU_HOST,
    ClusterBroker,
    LocalCluster,
)
from kafkatunnel.localcluster.netns import IsolationUnavailable, isolation_problem
from kafkatunnel.localcluster.ports import free_port, free_port_run

__all__ = [
    "TANSU_HOST",
    "ClusterBroker",
    "IsolationUnavailable",
    "LocalCluster",
    "free_port",
    "free_port_run",
    "isolation_problem",
]
