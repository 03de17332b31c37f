"""The workaround people use today, reproduced: every advertised broker address leads to one
broker, as with one `kubectl port-forward` plus a hosts entry for every broker name.

On the host, each advertised 127.0.0.1:<port> of the cluster gets a socat listener that
carries connections into the cluster, all to the same broker. Clients then connect to the
addresses the brokers advertise, and always reach that one broker.
"""

from __future__ import annotations

from kafkatunnel.demo.harness import ClusterBroker, LocalCluster
from kafkatunnel.demo.processes import ManagedProcess


class SingleForward:
    def __init__(self, cluster: LocalCluster, target: ClusterBroker) -> None:
        if not cluster.isolated:
            raise RuntimeError(
                "a single forward needs an isolated cluster: without isolation the advertised "
                "addresses already reach every broker directly"
            )
        self.cluster = cluster
        self.target = target
        self._processes: list[ManagedProcess] = []

    def start(self) -> SingleForward:
        inside = " ".join(self.cluster.inside([]))
        to_target = f"socat STDIO TCP\\:{self.target.host}\\:{self.target.port}"
        try:
            for broker in self.cluster.mock:
                self._processes.append(
                    ManagedProcess(
                        [
                            "socat",
                            f"TCP-LISTEN:{broker.port},bind=127.0.0.1,fork,reuseaddr",
                            f"EXEC:{inside} {to_target}",
                        ],
                        name=f"single-forward-{broker.port}",
                    )
                )
            for broker, process in zip(self.cluster.mock, self._processes, strict=True):
                process.wait_accepting(
                    broker.port, timeout=10, hint=" (is the port taken on this host?)"
                )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for process in self._processes:
            process.stop()
        self._processes.clear()

    def __enter__(self) -> SingleForward:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
