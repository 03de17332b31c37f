"""An isolated local Kafka cluster for the demo, the benchmarks and the tests."""

from kafkatunnel.localcluster.harness import TANSU_HOST, ClusterBroker, LocalCluster, free_port
from kafkatunnel.localcluster.netns import IsolationUnavailable, isolation_problem

__all__ = [
    "TANSU_HOST",
    "ClusterBroker",
    "IsolationUnavailable",
    "LocalCluster",
    "free_port",
    "isolation_problem",
]
