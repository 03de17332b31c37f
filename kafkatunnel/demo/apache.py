"""Apache Kafka itself, for `kafkatunnel demo --cluster apache`: three KRaft nodes (each
broker and controller, as Strimzi's combined node pools run them) in a network namespace of
their own, each on its own address, advertising the names pods get behind a headless
service (`kafka-N.kafka-headless.kafka.svc.cluster.local`) on one plaintext listener,
`plain` 9092.

Every kind of group Kafka 4.4 has is on with its defaults: classic, consumer (KIP-848),
share (KIP-932: `share.version` 2 at format) and streams (KIP-1071: `streams.version` 1, and
`streams` among `group.coordinator.rebalance.protocols`).

The jars come from Maven Central (org.apache.kafka:kafka_2.13 and kafka-tools, the version
below), fetched once by `scripts/_setup.sh` into a cache outside the repository, one per
version; Java 17 or newer runs them. `ApacheKafka(version=KAFKA_3_VERSION)` is the last 3.x
release, what many production clusters still run: the same cluster, formatted without 4.x's
features and logging through log4j 1. Nothing here imitates a broker: it writes
server.properties, formats the log directories with Kafka's StorageTool and starts
`kafka.Kafka`. A cluster with more listeners than the demo's builds on this one: its
`listeners` and the steps `start` takes (`_prepare`, `_settings`, `_format_options`,
`_before_launch`, `_jvm_options`, `_serving`) are where it says so.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Self

from kafkatunnel.demo.harness import ClusterBroker, groups_by_coordinator
from kafkatunnel.demo.netns import NetworkNamespace
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.probe import ProbeConnection
from kafkatunnel.waiting import wait_for

# The versions scripts/apache-kafka/pom.xml names (<kafka.version>, <kafka3.version>), which
# the set-up fetches; a test checks that they agree.
KAFKA_VERSION = "4.4.0"
KAFKA_3_VERSION = "3.9.2"
LIB_VARIABLE = "KAFKATUNNEL_KAFKA_LIB"  # where KAFKA_VERSION's jars are, if not the cache
NAMESPACE = "kafka"  # the Kubernetes namespace the names say
CONTROLLER_PORT, REPLICATION_PORT = 9090, 9091
PLAIN_PORT = 9092
PLAIN = {"plain": (PLAIN_PORT, "PLAINTEXT")}  # listener -> (port, security protocol)
START_TIMEOUT = 90.0
# Three JVMs on a 2-core laptop. The client compiler only (C1): a local cluster (the
# tests', the Apache demo's) carries little traffic, and C2's compiling is most of a
# broker's CPU in its first minute (scripts/bench_test_jvms.py: nearly half the CPU, ready
# sooner; docs/benchmarks.md).
JIT = "-XX:TieredStopAtLevel=1"
HEAP = ["-Xms192m", "-Xmx512m", "-XX:+UseSerialGC", JIT]
LOG4J = """\
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = INFO
logger.lifecycle.name = org.apache.kafka.server.BrokerLifecycleManager
logger.lifecycle.level = INFO
logger.quorum.name = org.apache.kafka.raft.QuorumState
logger.quorum.level = INFO
"""
LOG4J_1 = """\
log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaRaftServer=INFO
log4j.logger.kafka.server.BrokerServer=INFO
log4j.logger.kafka.server.BrokerLifecycleManager=INFO
log4j.logger.org.apache.kafka.raft.QuorumState=INFO
"""


class ApacheKafkaUnavailable(RuntimeError):
    """The jars or a Java to run them are missing; the message says how to get them."""


def kafka_lib(version: str = KAFKA_VERSION) -> Path:
    """The directory of Apache Kafka's jars, as scripts/_setup.sh fetched them."""
    configured = os.environ.get(LIB_VARIABLE) if version == KAFKA_VERSION else None
    lib = (
        Path(configured)
        if configured
        else Path.home() / ".cache" / "kafkatunnel" / f"apache-kafka-{version}" / "lib"
    )
    if not (lib / f"kafka_2.13-{version}.jar").exists():
        fetch = "-DoutputDirectory=" + str(lib)
        if version != KAFKA_VERSION:
            fetch += f" -Dkafka.version={version}"
        raise ApacheKafkaUnavailable(
            f"Apache Kafka {version} is not in {lib}: scripts/test fetches it from Maven "
            f"Central (mvn dependency:copy-dependencies -f scripts/apache-kafka/pom.xml "
            f"{fetch})" + (f", or set {LIB_VARIABLE}" if version == KAFKA_VERSION else "")
        )
    if shutil.which("java") is None:
        raise ApacheKafkaUnavailable(f"no java on PATH: Apache Kafka {version} needs Java 17")
    return lib


def is_kafka_3(version: str) -> bool:
    """Kafka 3.x, which logs through log4j 1 (reload4j), not log4j 2."""
    return version.split(".")[0] == "3"


def broker_host(node: int) -> str:
    return f"kafka-{node}.kafka-headless.{NAMESPACE}.svc.cluster.local"


def broker_address(node: int) -> str:
    """The node's own address in the cluster's network, as a pod has one."""
    return f"127.0.0.{11 + node}"


def node_settings(
    node: int,
    voters: list[str],
    address: str,
    data: Path,
    listeners: Mapping[str, tuple[int, str]] = PLAIN,
    version: str = KAFKA_VERSION,
) -> dict[str, str]:
    """A KRaft node's server.properties (broker and controller, as Strimzi's combined node
    pools run them) among `voters` (each node's name; node N is `voters[N]`, which it
    advertises), its `listeners` (name -> port and security protocol) bound to `address`.
    What a listener needs beyond its protocol (keys, logins) its caller adds."""
    nodes = len(voters)
    name = voters[node]
    quorum = ",".join(f"{n}@{host}:{CONTROLLER_PORT}" for n, host in enumerate(voters))
    listen = [f"CONTROLLER://{address}:{CONTROLLER_PORT}",
              f"REPLICATION://{address}:{REPLICATION_PORT}"]  # fmt: skip
    listen += [f"{k.upper()}://{address}:{port}" for k, (port, _) in listeners.items()]
    told = [f"REPLICATION://{name}:{REPLICATION_PORT}"]
    told += [f"{k.upper()}://{name}:{port}" for k, (port, _) in listeners.items()]
    protocols = ["CONTROLLER:PLAINTEXT", "REPLICATION:PLAINTEXT"]
    protocols += [f"{k.upper()}:{protocol}" for k, (_, protocol) in listeners.items()]
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node),
        "controller.quorum.voters": quorum,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "REPLICATION",
        "listeners": ",".join(listen),
        "advertised.listeners": ",".join(told),
        "listener.security.protocol.map": ",".join(protocols),
        "log.dirs": str(data),
        "num.partitions": "3",
        "offsets.topic.replication.factor": str(min(3, nodes)),
        "transaction.state.log.replication.factor": str(min(3, nodes)),
        "transaction.state.log.min.isr": str(min(2, nodes)),
        "group.initial.rebalance.delay.ms": "0",
        # Streams groups (KIP-1071) as prompt as the tests' classic ones: a lost member
        # noticed in 6 s, not 45, assignments carried by heartbeats every 1.5 s, not 5.
        "group.streams.initial.rebalance.delay.ms": "0",
        "group.streams.session.timeout.ms": "6000",
        "group.streams.min.session.timeout.ms": "6000",
        "group.streams.heartbeat.interval.ms": "1500",
        "group.streams.min.heartbeat.interval.ms": "1500",
    }  # fmt: skip
    if not is_kafka_3(version):  # share groups' state (Kafka 4), sized to the cluster
        settings["share.coordinator.state.topic.replication.factor"] = str(min(3, nodes))
        settings["share.coordinator.state.topic.min.isr"] = str(min(2, nodes))
    return settings


class ApacheKafka:
    """Start with `with ApacheKafka() as kafka:`; every process and file is gone on exit."""

    def __init__(self, nodes: int = 3, version: str = KAFKA_VERSION) -> None:
        self.nodes = nodes
        self.version = version
        self.lib = kafka_lib(version)
        self.listeners: dict[str, tuple[int, str]] = dict(PLAIN)
        self.namespace: NetworkNamespace | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix="kafkatunnel-apache-kafka-"))
        self.processes: list[ManagedProcess] = []
        self.cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")

    # -- what clients see ---------------------------------------------------------------------

    def brokers(self, listener: str = "plain") -> list[ClusterBroker]:
        port, _ = self.listeners[listener]
        return [ClusterBroker(node, broker_host(node), port) for node in range(self.nodes)]

    def bootstrap(self, listener: str = "plain") -> str:
        return self.brokers(listener)[0].address

    def exec_template(self) -> str:
        """An `exec` forwarder template that opens a byte stream to {host}:{port} inside,
        where the brokers' names resolve (the namespace's own /etc/hosts)."""
        assert self.namespace is not None
        return " ".join(self.namespace.exec_prefix()) + " socat STDIO TCP:{host}:{port}"

    def inside(self, argv: list[str]) -> list[str]:
        assert self.namespace is not None
        return [*self.namespace.exec_prefix(), *argv]

    def connect(self, host: str, port: int, timeout: float = 2.0) -> socket.socket:
        """A TCP connection from inside the cluster's network, by a broker's name."""
        assert self.namespace is not None
        names = {broker_host(n): broker_address(n) for n in range(self.nodes)}
        return self.namespace.connect(names.get(host, host), port, timeout)

    def groups_by_coordinator(
        self, per_broker: int, prefix: str, transactional: bool = False
    ) -> dict[int, list[str]]:
        """`per_broker` group ids (or transactional ids) coordinated by each broker."""
        nodes = list(range(self.nodes))
        return groups_by_coordinator(
            self.bootstrap(), self.connect, nodes, per_broker, prefix, transactional
        )

    def tool(self, main_class: str, *args: str, timeout: float = 120) -> str:
        """Run one of Kafka's own command-line tools (a kafka-tools main class) inside the
        cluster's network; its standard output, or RuntimeError with what it said."""
        argv = self.inside(["java", *HEAP, "-cp", f"{self.lib}/*", main_class, *args])
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"{main_class} {' '.join(args)}: {result.stderr[-2000:]}")
        return result.stdout

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> Self:
        try:
            hosts = {broker_host(n): broker_address(n) for n in range(self.nodes)}
            self.namespace = NetworkNamespace(hosts=hosts)
            self._prepare()
            configs = [self._configure(node) for node in range(self.nodes)]
            with ThreadPoolExecutor(self.nodes) as pool:
                list(pool.map(self._format, configs))
            self._before_launch()
            for node in range(self.nodes):
                self.processes.append(self._launch(node))
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Every node at once: one by one, the last waits out the quorum it lost."""

        def stop(process: ManagedProcess) -> None:
            with contextlib.suppress(Exception):
                process.stop(timeout=10)

        with ThreadPoolExecutor(max(len(self.processes), 1)) as pool:
            list(pool.map(stop, self.processes))
        self.processes.clear()
        if self.namespace is not None:
            self.namespace.close()
            self.namespace = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- set-up, step by step -----------------------------------------------------------------

    def _prepare(self) -> None:
        """What the nodes read, made before they are configured: their logging set-up."""
        (self.workdir / "log4j2.properties").write_text(LOG4J)
        (self.workdir / "log4j.properties").write_text(LOG4J_1)

    def _settings(self, node: int) -> dict[str, str]:
        """Node `node`'s server.properties."""
        voters = [broker_host(n) for n in range(self.nodes)]
        data = self.workdir / f"node-{node}" / "data"
        return node_settings(node, voters, broker_address(node), data, self.listeners,
                             self.version)  # fmt: skip

    def _configure(self, node: int) -> Path:
        path = self.workdir / f"node-{node}.properties"
        settings = self._settings(node)
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return path

    def _format_options(self) -> list[str]:
        """StorageTool's options beyond the cluster id and the config (none here)."""
        return []

    def _format(self, config: Path) -> None:
        """Kafka's StorageTool, as Kafka documents it. The features are the release's
        defaults: on 4.4, share groups (`share.version` 2) and streams groups
        (`streams.version` 1) among them; 3.9 has neither."""
        # `--cluster-id=ID`: a random id may begin with "-", which would read as an option
        self.tool("kafka.tools.StorageTool", "format", f"--cluster-id={self.cluster_id}",
                  "--config", str(config), *self._format_options(),
                  "--ignore-formatted")  # fmt: skip

    def _before_launch(self) -> None:
        """What must be up before a node starts (nothing here)."""

    def _jvm_options(self) -> list[str]:
        """A node's JVM options: its heap, and its logging set-up (log4j 2 from Kafka 4,
        log4j 1, reload4j, before)."""
        if is_kafka_3(self.version):
            logging = f"-Dlog4j.configuration=file:{self.workdir / 'log4j.properties'}"
        else:
            logging = f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}"
        return [*HEAP, logging]

    def _launch(self, node: int) -> ManagedProcess:
        config = self.workdir / f"node-{node}.properties"
        argv = ["java", *self._jvm_options(), "-cp", f"{self.lib}/*", "kafka.Kafka", str(config)]
        return ManagedProcess(self.inside(argv), name=f"kafka-{node}")

    def _serving(self, probe: ProbeConnection) -> bool:
        """Every broker is in the metadata and a group has a coordinator (the offsets topic
        exists)."""
        if len(probe.brokers()) < self.nodes:
            return False
        return probe.find_coordinator("kafkatunnel-ready").node_id >= 0

    def _wait_ready(self) -> None:
        """Until the cluster is serving (`_serving`), or a node has died (its output says
        why)."""

        def ready() -> bool:
            for process in self.processes:
                if not process.alive():
                    raise RuntimeError(f"{process.name} exited:\n{process.output()[-3000:]}")
            try:
                with ProbeConnection(self.bootstrap(), timeout=2, connect=self.connect) as probe:
                    return self._serving(probe)
            except (OSError, ValueError):
                return False

        wait_for(ready, timeout=START_TIMEOUT, interval=0.5, what="Apache Kafka to start")


class OneForward:
    """The field report's workaround, on this cluster: a laptop (a network namespace of its
    own) whose hosts file sends every broker name to 127.0.0.1, where one forward carries
    each connection to broker 0 (socat, as `kubectl port-forward kafka-0 9092:9092` would),
    optionally captured on the laptop's loopback by tcpdump, as a team would capture it."""

    def __init__(self, kafka: ApacheKafka, capture: Path | None = None) -> None:
        self.kafka = kafka
        self.capture = capture
        self.laptop: NetworkNamespace | None = None
        self.processes: list[ManagedProcess] = []

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap()

    def start(self) -> OneForward:
        port = PLAIN_PORT
        hosts = {broker_host(n): "127.0.0.1" for n in range(self.kafka.nodes)}
        try:
            self.laptop = NetworkNamespace(hosts=hosts)
            into = " ".join(self.kafka.inside([]))
            target = f"socat STDIO TCP\\:{broker_address(0)}\\:{port}"
            forward = ManagedProcess(
                [*self.laptop.exec_prefix(), "socat",
                 f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr", f"EXEC:{into} {target}"],
                name="one-forward",
            )  # fmt: skip
            self.processes.append(forward)
            forward.wait_accepting(port, timeout=10, connect=self._connect)
            if self.capture is not None:
                tcpdump = ManagedProcess(
                    [*self.laptop.exec_prefix(), "tcpdump", "-i", "lo", "-U", "-w",
                     str(self.capture), f"tcp port {port}"],
                    name="tcpdump",
                )  # fmt: skip
                self.processes.append(tcpdump)
                tcpdump.wait_for_line(r"listening on lo", timeout=10)
        except BaseException:
            self.stop()
            raise
        return self

    def _connect(self, host: str, port: int) -> socket.socket:
        assert self.laptop is not None
        return self.laptop.connect(host, port)

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """A command on the laptop, where every broker name leads to the one forward."""
        assert self.laptop is not None
        return subprocess.run([*self.laptop.exec_prefix(), *argv], capture_output=True,
                              text=True, timeout=timeout)  # fmt: skip

    def stop(self) -> None:
        for process in reversed(self.processes):  # tcpdump first: it writes what it has
            with contextlib.suppress(Exception):
                process.stop()
        self.processes.clear()
        if self.laptop is not None:
            self.laptop.close()
            self.laptop = None

    def __enter__(self) -> OneForward:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
