"""Apache Kafka in pods of the real one-node Kubernetes (kubernetes.py), laid out as Strimzi
0.4x lays out a Kafka cluster with one KRaft node pool of combined nodes: what
`kafkatunnel up --via kubectl` reads of a Strimzi cluster, made by hand (there is no
operator here), with Kafka's own jars running in the pods.

- pods `<cluster>-<pool>-N` with Strimzi's labels (strimzi.io/cluster, kind, name,
  pool-name, broker-role, controller-role, component-type, pod-name, controller-name and
  the app.kubernetes.io ones), hostname and subdomain, and its container port names
  (`tcp-ctrlplane` 9090, `tcp-replication` 9091, `tcp-clients` 9092, `tcp-clientstls` 9093,
  and `tcp-<listener>` for the others: `tcp-scram` 9094, `tcp-mtls` 9095), each node
  advertising `<pod>.<cluster>-kafka-brokers.<namespace>.svc` on every listener;
- the headless Service `<cluster>-kafka-brokers` and the bootstrap Service
  `<cluster>-kafka-bootstrap`, real Service objects;
- the cluster CA's certificate in the secret `<cluster>-cluster-ca-cert` (`ca.crt`), a
  KafkaUser secret for a scram-sha-512 user (`password`, `sasl.jaas.config`) and one for a
  tls user (`user.crt`, `user.key`, `ca.crt`: the clients CA), as the User Operator writes
  them;
- a volume per node that outlives its pod (a host directory, as a PersistentVolume), so a
  pod deleted and made again comes back with its log, as under a StrimziPodSet.

Name resolution: there is no cluster DNS. Once the pods run, every pod's /etc/hosts (the
kubelet's file, see KubernetesCluster.hosts_file) gets every node's name and real pod IP,
written from the host, and again whenever a pod comes back with a new address; a pod starts
Kafka only once the names are there (a container started again, whose /etc/hosts the kubelet
wrote afresh, takes them from a copy the host keeps in a directory the pods mount).
The brokers' server.properties are apache.py's (broker_settings); the SCRAM user is added
when the storage is formatted, as Kafka documents it.
"""

from __future__ import annotations

import base64
import contextlib
import secrets
import shutil
import socket
import tempfile
import uuid
from pathlib import Path
from typing import Any

from kafkatunnel.demo.apache import CONTROLLER_PORT, JIT, LOG4J, REPLICATION_PORT, kafka_lib
from kafkatunnel.demo.harness import ClusterBroker, groups_by_coordinator
from kafkatunnel.waiting import DeadlineExceeded, wait_for
from tests.worlds.apache import LISTENERS, broker_settings
from tests.worlds.authority import Authority
from tests.worlds.kubernetes import (
    CLUSTER_DOMAIN,
    JAVA,
    ApiError,
    KubernetesCluster,
    java_rootfs,
    pod_manifest,
)

CLUSTER, POOL, NAMESPACE = "my-cluster", "dual-role", "kafka"
SCRAM_USER, TLS_USER = "alice", "bob"  # KafkaUsers: scram-sha-512, tls
# Strimzi's container port names: the two it kept from before custom listeners, then
# `tcp-<listener name>` (ListenersUtils.backwardsCompatiblePortName).
PORT_NAMES = {"tcp-ctrlplane": CONTROLLER_PORT, "tcp-replication": REPLICATION_PORT,
              "tcp-clients": LISTENERS["plain"], "tcp-clientstls": LISTENERS["tls"],
              "tcp-scram": LISTENERS["scram"], "tcp-mtls": LISTENERS["mtls"]}  # fmt: skip
DATA, CERTS = "/var/lib/kafka/data", "/opt/kafka/certs"
LIBS, CONFIG = "/opt/kafka/libs", "/opt/kafka/config"
JAVA_OPTIONS = (
    f"-Xms128m -Xmx384m -XX:+UseSerialGC {JIT} "
    # names move to new pod IPs: look them up again soon, not after Java's 30 s
    "-Dsun.net.inetaddr.ttl=1 "
    f"-Dlog4j2.configurationFile={CONFIG}/log4j2.properties"
)
HOSTS_MARK = "# kafkatunnel: the Kafka pods"
START_TIMEOUT = 240.0
# Kafka's threads that say where a start-up waits (KafkaRaftServer's, the raft client's,
# the broker's lifecycle manager's, the quorum controller's and the metadata loader's)
KAFKA_THREADS = "main|kafka-|raft|broker-|quorum-controller|controller-|metadata"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class StrimziKafka:
    """Start with `with StrimziKafka(kube) as kafka:`; its pods, services, secrets and files
    are gone on exit (the namespace stays: nothing deletes namespaces here)."""

    def __init__(
        self,
        kube: KubernetesCluster,
        *,
        nodes: int = 3,
        cluster: str = CLUSTER,
        pool: str = POOL,
        namespace: str = NAMESPACE,
    ) -> None:
        self.kube = kube
        self.nodes = nodes
        self.cluster = cluster
        self.pool = pool
        self.namespace = namespace
        self.lib = kafka_lib()
        self.workdir = Path(tempfile.mkdtemp(prefix="kt-strimzi-"))
        self.cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        self.scram_password = secrets.token_urlsafe(12)
        self.cluster_ca: Path | None = None
        self.kubeconfig = self.workdir / "kubeconfig"
        # pods beside Kafka (Connect, say) that resolve the brokers too: (namespace, name)
        self.resolving: list[tuple[str, str]] = []

    # -- names ----------------------------------------------------------------------------------

    def pod_name(self, node: int) -> str:
        return f"{self.cluster}-{self.pool}-{node}"

    @property
    def headless(self) -> str:
        return f"{self.cluster}-kafka-brokers"

    @property
    def bootstrap_service(self) -> str:
        return f"{self.cluster}-kafka-bootstrap"

    def broker_host(self, node: int) -> str:
        """What node N advertises, and its certificate names."""
        return f"{self.pod_name(node)}.{self.headless}.{self.namespace}.svc"

    def brokers(self, listener: str = "plain") -> list[ClusterBroker]:
        port = LISTENERS[listener]
        return [ClusterBroker(n, self.broker_host(n), port) for n in range(self.nodes)]

    def bootstrap(self, listener: str = "plain") -> str:
        return self.brokers(listener)[0].address

    @property
    def labels(self) -> dict[str, str]:
        """The labels Strimzi gives every pod of the node pool (and selects them by)."""
        return {
            "strimzi.io/cluster": self.cluster,
            "strimzi.io/kind": "Kafka",
            "strimzi.io/name": f"{self.cluster}-kafka",
            "strimzi.io/component-type": "kafka",
            "strimzi.io/pool-name": self.pool,
            "app.kubernetes.io/name": "kafka",
            "app.kubernetes.io/instance": self.cluster,
            "app.kubernetes.io/part-of": f"strimzi-{self.cluster}",
            "app.kubernetes.io/managed-by": "strimzi-cluster-operator",
        }

    # -- reaching it from inside ----------------------------------------------------------------

    def pod_ips(self) -> dict[int, str]:
        found = {}
        for node in range(self.nodes):
            pod = self.kube.api("GET", self._pod_path(node))
            if pod.get("status", {}).get("podIP"):
                found[node] = pod["status"]["podIP"]
        return found

    def connect(self, host: str, port: int, timeout: float = 2.0) -> socket.socket:
        """A connection from the cluster's network to a broker by its name (or an address),
        as a pod makes one."""
        ips = self.pod_ips()
        names = {self.broker_host(n): ip for n, ip in ips.items()}
        return self.kube.connect(names.get(host, host), port, timeout)

    def groups_by_coordinator(self, per_broker: int, prefix: str) -> dict[int, list[str]]:
        return groups_by_coordinator(self.bootstrap(), self.connect, list(range(self.nodes)),
                                     per_broker, prefix)  # fmt: skip

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> StrimziKafka:
        try:
            self.kube.import_image(java_rootfs(), JAVA)
            self.kube.ensure_namespace(self.namespace)
            self._certificates()
            self._secrets()
            self._services()
            self._write_kubeconfig()
            for node in range(self.nodes):
                (self.workdir / f"data-{node}").mkdir()
                self.kube.create_pod(self._pod(node), namespace=self.namespace)
            self._write_hosts()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def replace_pod(self, node: int, *, grace: int = 30, probed: bool = True) -> dict[str, Any]:
        """Delete node's pod (with `grace` seconds to shut down, Strimzi's default) and make
        it again, as a StrimziPodSet does: a new pod, a new IP, the same volume (without a
        readiness probe when not `probed`: Ready as its container starts, long before
        Kafka listens, as a chart without one has it). Returns the new pod once Running
        and every pod's /etc/hosts knows its address."""
        path = self._pod_path(node)
        self.kube.api("DELETE", path, {"gracePeriodSeconds": grace})

        def gone() -> bool:
            try:
                self.kube.api("GET", path)
            except Exception as error:  # ApiError 404
                return getattr(error, "status", None) == 404
            return False

        wait_for(gone, timeout=grace + 60, what=f"pod {self.pod_name(node)} to go", interval=0.25)
        # the copy names the old pod's IP: the new container waits for the one written
        # once it runs, not for names that send it (and who asks it) to an address now gone
        (self.workdir / "config" / "hosts").write_text("")
        pod = self._pod(node)
        if not probed:
            del pod["spec"]["containers"][0]["readinessProbe"]
        self.kube.create_pod(pod, namespace=self.namespace)
        self._write_hosts()
        made: dict[str, Any] = self.kube.api("GET", path)
        return made

    def wait_node_ready(self, node: int, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        """Node's pod once Ready (Kafka listens); failing, what the pod and Kafka's own
        threads (the start-up in `main`, the raft, lifecycle and controller threads) were
        doing."""
        name = self.pod_name(node)
        try:
            return self.kube.wait_pod_ready(name, namespace=self.namespace, timeout=timeout)
        except DeadlineExceeded as error:
            threads = self.kube.java_threads(name, namespace=self.namespace,
                                             threads=KAFKA_THREADS)  # fmt: skip
            raise DeadlineExceeded(f"{error}\n{threads}") from error.__cause__

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until every pod is Ready and every broker in the metadata, and a group has a
        coordinator (the offsets topic exists)."""
        from kafkatunnel.probe import ProbeConnection

        for node in range(self.nodes):
            self.wait_node_ready(node, timeout)

        def ready() -> bool:
            try:
                with ProbeConnection(self.bootstrap(), timeout=2, connect=self.connect) as probe:
                    if len(probe.brokers()) < self.nodes:
                        return False
                    return probe.find_coordinator("kafkatunnel-ready").node_id >= 0
            except (OSError, ValueError):
                return False

        wait_for(ready, timeout=timeout, interval=0.5, what="Kafka in the pods to start")

    def stop(self) -> None:
        for node in range(self.nodes):
            with contextlib.suppress(Exception):
                self.kube.delete_pod(self.pod_name(node), namespace=self.namespace)
        base = f"/api/v1/namespaces/{self.namespace}"
        for kind, name in (("services", self.headless), ("services", self.bootstrap_service),
                           ("secrets", f"{self.cluster}-cluster-ca-cert"),
                           ("secrets", SCRAM_USER), ("secrets", TLS_USER)):  # fmt: skip
            with contextlib.suppress(Exception):
                self.kube.api("DELETE", f"{base}/{kind}/{name}")
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> StrimziKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- set-up ---------------------------------------------------------------------------------

    def _pod_path(self, node: int) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name(node)}"

    def _certificates(self) -> None:
        """The cluster CA signs the brokers (their Strimzi names), the clients CA the tls
        user, as Strimzi's two CAs do."""
        pki = self.workdir / "certs"
        pki.mkdir()
        cluster_ca = Authority(pki, "cluster CA")
        self.clients_ca = Authority(pki, "clients CA")
        bootstrap = self.bootstrap_service
        for node in range(self.nodes):
            name = self.broker_host(node)
            cluster_ca.issue(f"broker-{node}", [
                name, f"{name}.{CLUSTER_DOMAIN}", bootstrap, f"{bootstrap}.{self.namespace}",
                f"{bootstrap}.{self.namespace}.svc",
            ])  # fmt: skip
        self.tls_user = self.clients_ca.issue(TLS_USER, [TLS_USER], client=True)
        for path in pki.iterdir():  # Kafka in the pod runs as root, but keep it readable
            path.chmod(0o644)
        self.cluster_ca = cluster_ca.pem
        (self.workdir / "config").mkdir()
        (self.workdir / "config" / "log4j2.properties").write_text(LOG4J)

    def _secrets(self) -> None:
        assert self.cluster_ca is not None
        jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                f'username="{SCRAM_USER}" password="{self.scram_password}";')  # fmt: skip
        made = {
            f"{self.cluster}-cluster-ca-cert": (
                {"strimzi.io/kind": "Kafka"}, {"ca.crt": self.cluster_ca.read_bytes()}),
            SCRAM_USER: ({"strimzi.io/kind": "KafkaUser"}, {
                "password": self.scram_password.encode(), "sasl.jaas.config": jaas.encode()}),
            TLS_USER: ({"strimzi.io/kind": "KafkaUser"}, {
                "ca.crt": self.clients_ca.pem.read_bytes(),
                "user.crt": self.tls_user.cert.read_bytes(),
                "user.key": self.tls_user.key.read_bytes()}),
        }  # fmt: skip
        for name, (labels, data) in made.items():
            self.kube.api("POST", f"/api/v1/namespaces/{self.namespace}/secrets", {
                "metadata": {"name": name, "labels": {"strimzi.io/cluster": self.cluster,
                                                      **labels}},
                "type": "Opaque",
                "data": {key: _b64(value) for key, value in data.items()},
            })  # fmt: skip

    def _services(self) -> None:
        selector = {k: self.labels[k] for k in ("strimzi.io/cluster", "strimzi.io/kind",
                                                "strimzi.io/name")}  # fmt: skip
        ports = [{"name": name, "port": port, "targetPort": port, "protocol": "TCP"}
                 for name, port in PORT_NAMES.items()]  # fmt: skip
        headless = {"clusterIP": "None", "publishNotReadyAddresses": True, "ports": ports}
        bootstrap = {"type": "ClusterIP", "ports": ports[1:]}  # no controller port
        for name, spec in ((self.headless, headless), (self.bootstrap_service, bootstrap)):
            self.kube.api("POST", f"/api/v1/namespaces/{self.namespace}/services", {
                "metadata": {"name": name, "labels": self.labels},
                "spec": {**spec, "selector": selector},
            })  # fmt: skip

    def _write_kubeconfig(self) -> None:
        """The admin's kubeconfig whose context's namespace is the cluster's: `up` with no
        flags finds it there."""
        import json

        config = json.loads(self.kube.kubeconfig.read_text())
        config["contexts"][0]["context"]["namespace"] = self.namespace
        self.kubeconfig.write_text(json.dumps(config, indent=2))
        self.kubeconfig.chmod(0o600)

    def _pod(self, node: int) -> dict[str, Any]:
        name = self.pod_name(node)
        voters = [self.broker_host(n) for n in range(self.nodes)]
        settings = broker_settings(node, voters, "0.0.0.0", Path(f"{DATA}/kafka-log{node}"),
                                   Path(f"{CERTS}/broker-{node}.pem"),
                                   Path(f"{CERTS}/clients-CA.pem"))  # fmt: skip
        # combined nodes advertise their controller listener too (listeners bind 0.0.0.0)
        told = f"CONTROLLER://{voters[node]}:{CONTROLLER_PORT}"
        settings["advertised.listeners"] = f"{told},{settings['advertised.listeners']}"
        properties = "".join(f"{key}={value}\n" for key, value in settings.items())
        scram = f"SCRAM-SHA-512=[name={SCRAM_USER},password={self.scram_password}]"
        start = (
            # the names of every pod, as the host last wrote them (the kubelet wrote this
            # container's /etc/hosts afresh, without them)
            f"until [ -s {CONFIG}/hosts ]; do sleep 0.2; done && "
            f"cat {CONFIG}/hosts >> /etc/hosts && "
            "printf '%s' \"$SERVER_PROPERTIES\" > /tmp/server.properties && "
            f"java {JAVA_OPTIONS} -cp '{LIBS}/*' kafka.tools.StorageTool format "
            f"--cluster-id={self.cluster_id} --config /tmp/server.properties "
            f"--add-scram '{scram}' --ignore-formatted && "
            f"exec java {JAVA_OPTIONS} -cp '{LIBS}/*' kafka.Kafka /tmp/server.properties"
        )
        labels = {
            **self.labels,
            "strimzi.io/broker-role": "true",
            "strimzi.io/controller-role": "true",
            "strimzi.io/pod-name": name,
            "strimzi.io/controller": "strimzipodset",
            "strimzi.io/controller-name": f"{self.cluster}-{self.pool}",
        }
        pod = pod_manifest(name, ["/bin/sh", "-c", start], image=JAVA.name, ports=PORT_NAMES,
                           labels=labels, env={"SERVER_PROPERTIES": properties},
                           host_paths={LIBS: self.lib, CERTS: self.workdir / "certs",
                                       CONFIG: self.workdir / "config"})  # fmt: skip
        spec = pod["spec"]
        spec["hostname"], spec["subdomain"] = name, self.headless
        spec["terminationGracePeriodSeconds"] = 30
        spec["volumes"].append({"name": "data", "hostPath": {
            "path": str(self.workdir / f"data-{node}")}})  # fmt: skip
        container = spec["containers"][0]
        container["volumeMounts"].append({"name": "data", "mountPath": DATA})
        container["readinessProbe"] = {"tcpSocket": {"port": LISTENERS["plain"]},
                                       "periodSeconds": 1, "failureThreshold": 1}  # fmt: skip
        return pod

    def _write_hosts(self) -> None:
        """Every pod's /etc/hosts, once every pod runs: the kubelet's own lines, then each
        node's pod IP and names."""

        def running() -> list[dict[str, Any]] | None:
            pods = [self.kube.api("GET", self._pod_path(n)) for n in range(self.nodes)]
            if all(p.get("status", {}).get("phase") == "Running" for p in pods):
                return pods
            return None

        pods: list[dict[str, Any]] = wait_for(running, timeout=120, interval=0.25,
                                              what="the Kafka pods to run")  # fmt: skip
        lines = [HOSTS_MARK]
        for node, pod in enumerate(pods):
            name = self.broker_host(node)
            lines.append(f"{pod['status']['podIP']}\t{name}.{CLUSTER_DOMAIN} {name} "
                         f"{self.pod_name(node)}")  # fmt: skip
        (self.workdir / "config" / "hosts").write_text("\n".join(lines) + "\n")
        for namespace, name in self.resolving:
            with contextlib.suppress(ApiError):  # one replaced at the moment: it reads the copy
                pods.append(self.kube.api("GET", f"/api/v1/namespaces/{namespace}/pods/{name}"))
        for pod in pods:
            path = self.kube.hosts_file(pod)
            if path.exists():
                own = path.read_text().split(HOSTS_MARK)[0]
                path.write_text(own + "\n".join(lines) + "\n")

    def resolve_in(self, pod: dict[str, Any]) -> None:
        """`pod` (a running pod beside Kafka, one that mounts `hosts_copy`) resolves the
        brokers' names from now on, also after a broker's pod comes back elsewhere."""
        self.resolving.append((pod["metadata"]["namespace"], pod["metadata"]["name"]))
        self._write_hosts()

    @property
    def hosts_copy(self) -> tuple[str, Path]:
        """Where a pod mounts the host's copy of the brokers' names (container path, host
        path), to add them to its /etc/hosts when its container starts."""
        return CONFIG, self.workdir / "config"
