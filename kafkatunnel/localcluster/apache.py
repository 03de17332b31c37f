"""Apache Kafka itself, as the reference cluster: three KRaft nodes (each broker and
controller, as Strimzi's combined node pools run them) in a network namespace of their own,
each on its own address, advertising the names pods get behind a headless service
(`kafka-N.kafka-headless.kafka.svc.cluster.local`), with Strimzi's kinds of listener:

    plain  9092  PLAINTEXT
    tls    9093  SSL, the brokers' certificates from the cluster CA, naming them
    scram  9094  SASL_SSL, SCRAM-SHA-512 (users added at format time, as Kafka documents)
    mtls   9095  SSL with a client certificate from the clients CA required

and, beside Strimzi's, the other SASL logins Kafka has, in plaintext, for the same user:

    scram256  9096  SASL_PLAINTEXT, SCRAM-SHA-256 (added at format time too)
    sasl      9097  SASL_PLAINTEXT, PLAIN (the user in the listener's JAAS line)
    reauth    9099  SASL_SSL, SCRAM-SHA-512 as `scram`, with sessions of REAUTH_MS
                    (KIP-368: `connections.max.reauth.ms`, which a Strimzi Kafka's
                    config may set; a connection not logged in again before its
                    session ends is closed at its next request)

and, with `ApacheKafka(oauth=True)`, a listener whose tokens an identity provider gives
(Keycloak, keycloak.py), started beside the cluster and ready before the brokers (each
reads its keys as it starts, and does not start without them):

    oauth     9098  SASL_PLAINTEXT, OAUTHBEARER, checked by Kafka's own validator

Every kind of group Kafka 4.4 has is on with its defaults: classic, consumer (KIP-848),
share (KIP-932: `share.version` 2 at format) and streams (KIP-1071: `streams.version` 1, and
`streams` among `group.coordinator.rebalance.protocols`).

The jars come from Maven Central (org.apache.kafka:kafka_2.13 and kafka-tools, the version
below), fetched once by `scripts/_setup.sh` into a cache outside the repository, one per
version; Java 17 or newer runs them. `ApacheKafka(version=KAFKA_3_VERSION)` is the last 3.x
release, what many production clusters still run: the same cluster, formatted without 4.x's
features and logging through log4j 1. Nothing here imitates a broker: it writes
server.properties, formats the log directories with Kafka's StorageTool and starts
`kafka.Kafka`.
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafkatunnel.localcluster.authority import Authority, Issued
from kafkatunnel.localcluster.harness import ClusterBroker, groups_by_coordinator
from kafkatunnel.localcluster.keycloak import Keycloak
from kafkatunnel.localcluster.netns import NetworkNamespace
from kafkatunnel.localcluster.processes import ManagedProcess
from kafkatunnel.waiting import wait_for

# The versions scripts/apache-kafka/pom.xml names (<kafka.version>, <kafka3.version>), which
# the set-up fetches; a test checks that they agree.
KAFKA_VERSION = "4.4.0"
KAFKA_3_VERSION = "3.9.2"
LIB_VARIABLE = "KAFKATUNNEL_KAFKA_LIB"  # where KAFKA_VERSION's jars are, if not the cache
NAMESPACE = "kafka"  # the Kubernetes namespace the names say
CONTROLLER_PORT, REPLICATION_PORT = 9090, 9091
LISTENERS = {"plain": 9092, "tls": 9093, "scram": 9094, "mtls": 9095, "scram256": 9096,
             "sasl": 9097, "oauth": 9098, "reauth": 9099}  # fmt: skip
PROTOCOLS = {"plain": "PLAINTEXT", "tls": "SSL", "scram": "SASL_SSL", "mtls": "SSL",
             "scram256": "SASL_PLAINTEXT", "sasl": "SASL_PLAINTEXT",
             "oauth": "SASL_PLAINTEXT", "reauth": "SASL_SSL"}  # fmt: skip
REAUTH_MS = 3000  # the reauth listener's session lifetime
SCRAM_USER, SCRAM_PASSWORD = "alice", "alice-s3cret"
MTLS_USER = "bob"
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
"""
LOG4J_1 = """\
log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaRaftServer=INFO
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


@dataclass(frozen=True)
class Credentials:
    """What clients present: the cluster CA to trust, the SCRAM user, the mTLS user."""

    cluster_ca: Path
    clients_ca: Path
    scram_user: str
    scram_password: str
    mtls_user: Issued


def broker_settings(
    node: int,
    voters: list[str],
    address: str,
    data: Path,
    keystore: Path,
    clients_ca: Path,
    version: str = KAFKA_VERSION,
    oauth: Keycloak | None = None,
) -> dict[str, str]:
    """A KRaft node's server.properties (broker and controller, as Strimzi's combined node
    pools run them) among `voters` (each node's name; node N is `voters[N]`, which it
    advertises), its listeners bound to `address`, with Strimzi's kinds of listener (see
    LISTENERS); `keystore` is its key and certificate (PEM), `clients_ca` signs mTLS users.
    The `oauth` listener only with an identity provider (`oauth`) that its tokens come from."""
    nodes = len(voters)
    listeners = {k: port for k, port in LISTENERS.items() if k != "oauth" or oauth}
    name = voters[node]
    quorum = ",".join(f"{n}@{host}:{CONTROLLER_PORT}" for n, host in enumerate(voters))
    listen = [f"CONTROLLER://{address}:{CONTROLLER_PORT}",
              f"REPLICATION://{address}:{REPLICATION_PORT}"]  # fmt: skip
    listen += [f"{k.upper()}://{address}:{port}" for k, port in listeners.items()]
    told = [f"REPLICATION://{name}:{REPLICATION_PORT}"]
    told += [f"{k.upper()}://{name}:{port}" for k, port in listeners.items()]
    protocols = ["CONTROLLER:PLAINTEXT", "REPLICATION:PLAINTEXT"]
    protocols += [f"{k.upper()}:{PROTOCOLS[k]}" for k in listeners]
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
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(clients_ca),
        "listener.name.mtls.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.scram.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "listener.name.scram256.sasl.enabled.mechanisms": "SCRAM-SHA-256",
        "listener.name.scram256.scram-sha-256.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "listener.name.reauth.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "listener.name.reauth.scram-sha-512.connections.max.reauth.ms": str(REAUTH_MS),
        "listener.name.sasl.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl.plain.sasl.jaas.config":
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'user_{SCRAM_USER}="{SCRAM_PASSWORD}";',
    }  # fmt: skip
    if not is_kafka_3(version):  # share groups' state (Kafka 4), sized to the cluster
        settings["share.coordinator.state.topic.replication.factor"] = str(min(3, nodes))
        settings["share.coordinator.state.topic.min.isr"] = str(min(2, nodes))
    if oauth is not None:  # tokens checked by Kafka's own validator, against the realm's keys
        settings.update(oauth.broker_settings())
        settings["listener.name.oauth.sasl.enabled.mechanisms"] = "OAUTHBEARER"
        settings["listener.name.oauth.oauthbearer.sasl.jaas.config"] = (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
        )
        settings["listener.name.oauth.oauthbearer.sasl.server.callback.handler.class"] = (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
        )
    return settings


class ApacheKafka:
    """Start with `with ApacheKafka() as kafka:`; every process and file is gone on exit."""

    def __init__(
        self,
        nodes: int = 3,
        version: str = KAFKA_VERSION,
        offsets_topic: bool = True,
        oauth: bool = False,
    ) -> None:
        """`offsets_topic=False`: ready once every broker is up, before anything has made
        `__consumer_offsets`: the first group's look-up creates it, as on a new cluster.
        `oauth`: the `oauth` listener too, with its identity provider (`self.keycloak`)."""
        self.nodes = nodes
        self.version = version
        self.offsets_topic = offsets_topic
        self.lib = kafka_lib(version)
        self.namespace: NetworkNamespace | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix="kafkatunnel-apache-kafka-"))
        self.processes: list[ManagedProcess] = []
        self.cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        self.credentials: Credentials | None = None
        self.keycloak = Keycloak() if oauth else None

    # -- what clients see ---------------------------------------------------------------------

    def brokers(self, listener: str = "plain") -> list[ClusterBroker]:
        port = LISTENERS[listener]
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

    def start(self) -> ApacheKafka:
        try:
            hosts = {broker_host(n): broker_address(n) for n in range(self.nodes)}
            self.namespace = NetworkNamespace(hosts=hosts)
            if self.keycloak is not None:  # it starts while the nodes are formatted
                self.keycloak.launch()
            self.credentials = self._certificates()
            configs = [self._configure(node) for node in range(self.nodes)]
            with ThreadPoolExecutor(self.nodes) as pool:
                list(pool.map(self._format, configs))
            if self.keycloak is not None:  # a broker whose JWKS endpoint is down exits
                self.keycloak.wait_ready()
                self.keycloak.reachable_from(self.namespace)
            for node in range(self.nodes):
                self.processes.append(self._launch(node))
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self, node: int) -> None:
        """Stop one node and start it again in place, as a deleted broker pod comes back
        with its volume: the groups it coordinated move to other brokers and, once it is
        back and leads again, return. Returns once it is in the metadata again and back in
        every partition's in-sync replicas, so that a preferred leader election run then moves
        every leadership back at once: one it could not move yet, Kafka's own rebalance
        (`auto.leader.rebalance.enable`, every 5 minutes) would move later, under whatever
        the cluster's next user is doing, and its groups' coordinators with it."""
        self.processes[node].stop(timeout=30)
        self.processes[node] = self._launch(node)
        self._wait_ready()  # a broker again, and its groups' coordinators found
        wait_for(self._in_sync, timeout=START_TIMEOUT, interval=0.5,
                 what=f"kafka-{node} back in every partition's in-sync replicas")  # fmt: skip

    def _in_sync(self) -> bool:
        """Every replica of every partition, internal topics too, is in sync (from a
        Metadata v1 request for all topics)."""
        from kio.index import load_request_schema

        from kafkatunnel.probe import METADATA, ProbeConnection

        request_type: Any = load_request_schema(METADATA, 1)
        try:
            with ProbeConnection(self.bootstrap(), timeout=2, connect=self.connect) as probe:
                answer = probe.request(request_type(topics=None))
        except (OSError, ValueError):
            return False
        return all(set(p.isr_nodes) == set(p.replica_nodes)
                   for t in answer.topics for p in t.partitions)  # fmt: skip

    def _launch(self, node: int) -> ManagedProcess:
        logging = self._logging()
        config = self.workdir / f"node-{node}.properties"
        oauth = [] if self.keycloak is None else self.keycloak.jvm_flags()
        argv = ["java", *HEAP, *oauth, logging, "-cp", f"{self.lib}/*", "kafka.Kafka", str(config)]
        return ManagedProcess(self.inside(argv), name=f"kafka-{node}")

    def stop(self) -> None:
        """Every node at once: one by one, the last waits out the quorum it lost."""

        def stop(process: ManagedProcess) -> None:
            with contextlib.suppress(Exception):
                process.stop(timeout=10)

        with ThreadPoolExecutor(max(len(self.processes), 1)) as pool:
            list(pool.map(stop, self.processes))
        self.processes.clear()
        if self.keycloak is not None:
            self.keycloak.stop()
        if self.namespace is not None:
            self.namespace.close()
            self.namespace = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- set-up ---------------------------------------------------------------------------------

    def _certificates(self) -> Credentials:
        pki = self.workdir / "pki"
        pki.mkdir(mode=0o700)
        cluster_ca = Authority(pki, "kafka cluster CA")
        clients_ca = Authority(pki, "kafka clients CA")
        for node in range(self.nodes):
            name = broker_host(node)
            cluster_ca.issue(f"broker-{node}", [name, name.removesuffix(".cluster.local")])
        bob = clients_ca.issue(MTLS_USER, [MTLS_USER], client=True)
        (self.workdir / "log4j2.properties").write_text(LOG4J)
        (self.workdir / "log4j.properties").write_text(LOG4J_1)
        return Credentials(cluster_ca.pem, clients_ca.pem, SCRAM_USER, SCRAM_PASSWORD, bob)

    def _configure(self, node: int) -> Path:
        assert self.credentials is not None
        voters = [broker_host(n) for n in range(self.nodes)]
        settings = broker_settings(
            node, voters, broker_address(node), self.workdir / f"node-{node}" / "data",
            self.workdir / "pki" / f"broker-{node}.pem", self.credentials.clients_ca,
            self.version, self.keycloak,
        )  # fmt: skip
        path = self.workdir / f"node-{node}.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return path

    def _logging(self) -> str:
        """The JVM flag naming the broker's logging set-up: log4j 2 from Kafka 4, log4j 1
        (reload4j) before."""
        if is_kafka_3(self.version):
            return f"-Dlog4j.configuration=file:{self.workdir / 'log4j.properties'}"
        return f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}"

    def _format(self, config: Path) -> None:
        """Kafka's StorageTool, as Kafka documents it: SCRAM users added at format time.
        The features are the release's defaults: on 4.4, share groups (`share.version` 2)
        and streams groups (`streams.version` 1) among them; 3.9 has neither."""
        users = [f"SCRAM-SHA-{bits}=[name={SCRAM_USER},password={SCRAM_PASSWORD}]"
                 for bits in (512, 256)]  # fmt: skip
        # `--cluster-id=ID`: a random id may begin with "-", which would read as an option
        self.tool("kafka.tools.StorageTool", "format", f"--cluster-id={self.cluster_id}",
                  "--config", str(config), *(a for u in users for a in ("--add-scram", u)),
                  "--ignore-formatted")  # fmt: skip

    def _wait_ready(self) -> None:
        """Until every broker is in the metadata and a group has a coordinator (the
        offsets topic exists), or a node has died (its output says why)."""
        from kafkatunnel.probe import ProbeConnection

        def ready() -> bool:
            for process in self.processes:
                if not process.alive():
                    raise RuntimeError(f"{process.name} exited:\n{process.output()[-3000:]}")
            try:
                with ProbeConnection(self.bootstrap(), timeout=2, connect=self.connect) as probe:
                    if len(probe.brokers()) < self.nodes:
                        return False
                    if not self.offsets_topic:
                        return True
                    return probe.find_coordinator("kafkatunnel-ready").node_id >= 0
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
        port = LISTENERS["plain"]
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
