"""A real one-node Kubernetes, for what only a real one shows: `kubectl port-forward`
answered by kube-apiserver, the kubelet and containerd rather than by a stand-in.

Everything runs in a network namespace of its own (entered with nsenter); the kubelet and
containerd also in a mount namespace of their own (tests/worlds/private_mounts.py), where
what they write to machine-wide paths lands in the cluster's directory and what they mount
goes when they do. etcd and kube-apiserver listen on the namespace's loopback, the kubelet
on the address of the pods' bridge, containerd over CRI with the bridge CNI plugin, so pod
addresses exist only inside. kubectl on the host reaches the API server through a relay on
the host's loopback (a socat there, a socat inside, a Unix socket between them): nothing of
the cluster listens anywhere else.

kube-apiserver authorizes with the Node and RBAC authorizers, users are client
certificates from the cluster's own CA, service-account tokens are signed with a key made
here. There is no scheduler and no controller manager: pods name their node, and each
namespace gets its `default` service account by hand.

kube-apiserver and the kubelet are built from Kubernetes' Go modules by scripts/_setup.sh
(kt_kubernetes) into a cache outside the repository; etcd, containerd, runc, the CNI plugins
and busybox are Debian's, unpacked there. The images are made here from those files and
imported into containerd: no registry is asked for anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import io
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tarfile
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from kafkatunnel.demo.netns import NETNS_RUN_DIR, NetworkNamespace
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.waiting import DeadlineExceeded, wait_for
from tests.worlds.authority import Authority, Issued
from tests.worlds.private_mounts import PrivateMounts, present

VERSION = "1.34.4"
HOME_VARIABLE = "KT_KUBERNETES"  # where scripts/_setup.sh put it, if not the cache
NODE = "kt-node"
POD_SUBNET = "10.244.0.0/24"  # the pods' bridge's, inside the namespace
BRIDGE = "kt0"
NODE_ADDRESS = "10.244.0.1"  # the kubelet's: the bridge's own, the pods' gateway
SERVICE_RANGE = "10.96.0.0/24"
CLUSTER_DOMAIN = "cluster.local"
APISERVER_PORT, ETCD_PORT, ETCD_PEER_PORT, KUBELET_PORT = 6443, 2379, 2380, 10250
BUSYBOX_IMAGE = "docker.io/kafkatunnel-tests/busybox:1"
PAUSE_IMAGE = "docker.io/kafkatunnel-tests/pause:1"
START_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0
# The shell-free programs a busybox image offers, linked to the one static binary.
APPLETS = ("sh", "cat", "echo", "sleep", "nc", "ls", "ps", "hostname", "ip", "wget", "env")


class KubernetesUnavailable(RuntimeError):
    """The binaries are missing; the message says how to get them."""


def kubernetes_home() -> Path:
    """Where scripts/_setup.sh built kube-apiserver and the kubelet (bin/) and unpacked
    Debian's etcd, containerd, runc, CNI plugins and busybox (debian/)."""
    configured = os.environ.get(HOME_VARIABLE)
    home = (
        Path(configured)
        if configured
        else Path.home() / ".cache" / "kafkatunnel" / f"kubernetes-{VERSION}"
    )
    needed = [home / "bin/kube-apiserver", home / "bin/kubelet",
              home / "debian/usr/bin/etcd", home / "debian/usr/bin/containerd",
              home / "debian/usr/sbin/runc", home / "debian/usr/lib/cni/bridge",
              home / "debian/bin/busybox"]  # fmt: skip
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        raise KubernetesUnavailable(
            f"Kubernetes {VERSION} is not built in {home} (missing {', '.join(missing)}): "
            f"scripts/test builds it (source scripts/_setup.sh; kt_kubernetes), or set "
            f"{HOME_VARIABLE}"
        )
    for tool in ("socat", "nsenter", "ip", "mount", "umount"):
        if shutil.which(tool) is None:
            raise KubernetesUnavailable(f"{tool} is not on PATH: the local Kubernetes needs it")
    return home


@dataclass(frozen=True)
class User:
    """A user of the API server: a client certificate from the cluster's CA, and a
    kubeconfig that presents it."""

    name: str
    certificate: Issued
    kubeconfig: Path


class ApiError(RuntimeError):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text}")
        self.status = status


class KubernetesCluster:
    """Start with `with KubernetesCluster() as kube:`; every process, mount, interface and
    file it made is gone on exit."""

    def __init__(self, *, streaming_idle_timeout: str = "30s") -> None:
        """`streaming_idle_timeout`: how long a port-forward may idle before the runtime
        closes it. containerd's stream_idle_timeout is the one that acts (the kubelet's
        streamingConnectionIdleTimeout, set alike, only binds runtimes inside the kubelet)."""
        self.home = kubernetes_home()
        self.debian = self.home / "debian"
        self.streaming_idle_timeout = streaming_idle_timeout
        # short: Unix socket paths (containerd's, the relay's) are bounded
        self.workdir = Path(tempfile.mkdtemp(prefix="kt-k8s-"))
        self.namespace: NetworkNamespace | None = None
        self.private_mounts = PrivateMounts(self.workdir, name="kubernetes")
        self._machine_paths_before: set[Path] = set()
        self.processes: dict[str, ManagedProcess] = {}
        self.port = 0  # the API server's relay on the host's loopback
        self.admin: User | None = None
        self._authority: Authority | None = None
        self._cgroups_before: dict[Path, set[str]] = {}
        self._namespace_name: str | None = None
        self._containers: set[str] = set()  # every container id seen, for leftovers()
        self._imported: set[str] = set()  # image names
        self._commands: dict[str, tuple[list[str], dict[str, str] | None]] = {}

    # -- what tests use -----------------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        assert self.admin is not None, "not started"
        return self.admin.kubeconfig

    def api(self, method: str, path: str, body: Any = None, *, timeout: float = 30) -> Any:
        """One call to the API server as the admin user: the decoded JSON answer, or
        ApiError with what the server said."""
        assert self.admin is not None and self._authority is not None, "not started"
        context = ssl.create_default_context(cafile=str(self._authority.pem))
        context.load_cert_chain(str(self.admin.certificate.cert), str(self.admin.certificate.key))
        connection = http.client.HTTPSConnection("127.0.0.1", self.port, context=context,
                                                 timeout=timeout)  # fmt: skip
        try:
            data = None if body is None else json.dumps(body).encode()
            content = "application/merge-patch+json" if method == "PATCH" else "application/json"
            connection.request(method, path, body=data, headers={"Content-Type": content})
            response = connection.getresponse()
            text = response.read().decode(errors="replace")
        finally:
            connection.close()
        if response.status >= 300:
            raise ApiError(response.status, text)
        return json.loads(text) if text.startswith("{") else text

    def ensure_namespace(self, name: str) -> None:
        """The namespace and its `default` service account (no controller makes it here)."""
        with contextlib.suppress(ApiError):
            self.api("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        with contextlib.suppress(ApiError):
            self.api("POST", f"/api/v1/namespaces/{name}/serviceaccounts",
                     {"metadata": {"name": "default"}})  # fmt: skip

    def run_pod(
        self,
        name: str,
        command: list[str],
        *,
        namespace: str = "default",
        image: str = BUSYBOX_IMAGE,
        ports: dict[str, int] | None = None,
        labels: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        host_paths: dict[str, Path] | None = None,
        timeout: float = 60,
    ) -> dict[str, Any]:
        """A pod on the node, running `command`, with `env` (the value `status.podIP` is
        the pod's address) and host directories mounted read-only (container path ->
        host path); returns it once Running and Ready."""
        pod = pod_manifest(name, command, image=image, ports=ports, labels=labels, env=env,
                           host_paths=host_paths)  # fmt: skip
        self.create_pod(pod, namespace=namespace)
        return self.wait_pod_ready(name, namespace=namespace, timeout=timeout)

    def create_pod(self, pod: dict[str, Any], *, namespace: str = "default") -> None:
        """The pod (a manifest, see pod_manifest) created, without waiting for it."""
        self.ensure_namespace(namespace)
        self.api("POST", f"/api/v1/namespaces/{namespace}/pods", pod)

    def hosts_file(self, pod: dict[str, Any]) -> Path:
        """The pod's /etc/hosts as the kubelet keeps it (written whenever one of its
        containers is made): there is no cluster DNS here, so the names a pod must resolve
        are written into it from the host once its container runs."""
        return self.workdir / "kubelet" / "pods" / str(pod["metadata"]["uid"]) / "etc-hosts"

    def wait_pod_ready(
        self, name: str, *, namespace: str = "default", timeout: float = 60
    ) -> dict[str, Any]:
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"

        def ready() -> Any:
            pod = self.api("GET", path)
            conditions = pod.get("status", {}).get("conditions", [])
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return pod
            return None

        try:
            pod: dict[str, Any] = wait_for(ready, timeout=timeout, interval=0.25,
                                           what=f"pod {namespace}/{name} to be ready")  # fmt: skip
        except DeadlineExceeded as error:
            raise DeadlineExceeded(f"{error}; {self.pod_story(name, namespace=namespace)}") from (
                error.__cause__
            )
        return pod

    def java_threads(
        self, name: str, *, namespace: str = "default", threads: str = ".", lines: int = 14
    ) -> str:
        """The top of each stack whose thread's name matches `threads` (a regular
        expression), in the JVM that is the pod's first container (its process 1): SIGQUIT
        makes a JVM write every thread's stack to its output and go on."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        try:
            statuses = self.api("GET", path).get("status", {}).get("containerStatuses", [])
            container = str(statuses[0]["containerID"]).split("://")[-1]
            killed = self._ctr("tasks", "kill", "--signal", "SIGQUIT", container, timeout=20)
        except (ApiError, OSError, LookupError, subprocess.TimeoutExpired) as error:
            return f"(no thread dump: {error})"
        if killed.returncode != 0:
            return f"(no thread dump: ctr said {killed.stderr.strip()})"

        def dumped() -> str | None:
            log = str(self.api("GET", f"{path}/log?tailLines=5000"))
            start = log.rfind("Full thread dump")
            return log[start:] if start >= 0 and "JNI global refs" in log[start:] else None

        try:
            what = f"pod {namespace}/{name}'s JVM to write its threads"
            dump: str = wait_for(dumped, timeout=30, interval=0.5, what=what)
        except DeadlineExceeded as error:
            return f"(no thread dump: {error})"
        stacks = [block.splitlines()[:lines] for block in dump.split("\n\n")[1:]]
        named = re.compile(f'^"(?:{threads})')
        running = [s for s in stacks if s and named.match(s[0]) and "\tat " in "\n".join(s)]
        return "its JVM's threads:\n" + "\n\n".join("\n".join(s) for s in running)

    def pod_story(self, name: str, *, namespace: str = "default") -> str:
        """What a pod that is not ready is doing: its phase, each container's state and
        restarts, and the last lines its container wrote (for a failing wait to say)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        try:
            status = self.api("GET", path).get("status", {})
        except (ApiError, OSError) as error:
            return f"the pod could not be read: {error}"
        told = [f"phase {status.get('phase')}, IP {status.get('podIP')}"]
        for container in status.get("containerStatuses", []):
            state = container.get("state", {})
            told.append(f"container {container.get('name')}: {json.dumps(state)}, "
                        f"{container.get('restartCount', 0)} restarts")  # fmt: skip
        told.extend(self._last_events(name, namespace))  # a failing probe says how it failed
        try:
            log = self.api("GET", f"{path}/log?tailLines=40")
        except (ApiError, OSError) as error:
            log = f"(no log: {error})"
        return "; ".join(told) + f"; its log ends:\n{log}"

    def _last_events(self, name: str, namespace: str, count: int = 5) -> list[str]:
        """The pod's last events (the kubelet's "Readiness probe failed: ...", say)."""
        selector = urllib.parse.quote(f"involvedObject.kind=Pod,involvedObject.name={name}")
        try:
            listed = self.api("GET", f"/api/v1/namespaces/{namespace}/events"
                                     f"?fieldSelector={selector}")  # fmt: skip
        except (ApiError, OSError) as error:
            return [f"no events: {error}"]

        def when(event: dict[str, Any]) -> str:
            return str(event.get("lastTimestamp") or event.get("eventTime") or "")

        events = sorted(listed.get("items", []), key=when)
        return [f"event {e.get('reason')} x{e.get('count', 1)}: {e.get('message')}"
                for e in events[-count:]]  # fmt: skip

    def delete_pod(self, name: str, *, namespace: str = "default", timeout: float = 60) -> None:
        """Delete the pod and wait until the API server has forgotten it (the kubelet
        stopped its containers)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        with contextlib.suppress(ApiError):
            self.api("DELETE", path, {"gracePeriodSeconds": 1})

        def gone() -> bool:
            try:
                self.api("GET", path)
            except ApiError as error:
                return error.status == 404
            return False

        wait_for(gone, timeout=timeout, what=f"pod {namespace}/{name} to be deleted",
                 interval=0.25)  # fmt: skip

    def user(self, name: str, groups: tuple[str, ...] = ()) -> User:
        """A user with a client certificate of the cluster's CA (and no permissions until
        RBAC grants some), and a kubeconfig of its own."""
        assert self._authority is not None, "not started"
        issued = self._authority.issue(f"user-{name}", [name], client=True, groups=groups)
        kubeconfig = self.workdir / f"kubeconfig-{name}"
        self._write_kubeconfig(kubeconfig, name, issued)
        return User(name, issued, kubeconfig)

    def inside(self, argv: list[str]) -> list[str]:
        """`argv` run in the cluster's network namespace (and the host's mounts)."""
        assert self.namespace is not None
        return ["nsenter", f"--net={NETNS_RUN_DIR / self.namespace.name}", "--", *argv]

    def _on_node(self, argv: list[str]) -> list[str]:
        """`argv` run as the node's daemons run: in the cluster's network namespace and in
        its private mounts."""
        assert self.namespace is not None
        return self.private_mounts.enter(argv, net=NETNS_RUN_DIR / self.namespace.name)

    def connect(self, host: str, port: int, timeout: float = 2.0) -> socket.socket:
        """A TCP connection from inside the cluster's network (a pod address, say)."""
        assert self.namespace is not None
        return self.namespace.connect(host, port, timeout)

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> KubernetesCluster:
        try:
            self._cgroups_before = _cgroup_children()
            self._machine_paths_before = present()
            self.namespace = NetworkNamespace()
            self._namespace_name = self.namespace.name
            self._node_address()
            pki = self._certificates()
            self._start_etcd()
            self._start_apiserver(pki)
            self._start_relay()
            self._wait_apiserver()
            self.private_mounts.start()
            self._start_containerd()
            self._import_images()
            self._start_kubelet(pki)
            self._wait_node_ready()
            self.ensure_namespace("default")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Pods first (the kubelet tears their sandboxes and networks down), then each
        process; then whatever mount, pod network namespace, cgroup or process is left.
        A containerd or kubelet found dead is started again first: only they can stop the
        pods' containers and tear their networks down."""
        for name in ("containerd", "kubelet"):
            process = self.processes.get(name)
            if process is not None and not process.alive():
                with contextlib.suppress(Exception):
                    self._process(name, *self._commands[name])
                    if name == "containerd":
                        self._wait_containerd()
        if "kubelet" in self.processes and self.admin is not None:
            with contextlib.suppress(Exception):
                self._delete_all_pods()
        if "containerd" in self.processes:
            with contextlib.suppress(Exception):
                self._containers.update(self._sandboxes())
                self._kill_containers()
        for name in ("kubelet", "containerd", "relay-host", "relay-inside",
                     "kube-apiserver", "etcd"):  # fmt: skip
            process = self.processes.pop(name, None)
            if process is not None:
                with contextlib.suppress(Exception):
                    process.stop(timeout=15)
        if self.namespace is not None:
            self.namespace.close()  # kills what is left in it: containerd's shims
            self.namespace = None
        self.private_mounts.stop()  # its mounts go with the last process in it
        _unmount_under(self.workdir)
        _remove_new_cgroups(self._cgroups_before)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of this cluster outlived stop(): processes, mounts, its network namespace,
        its containers' cgroups, its directory, a machine-wide path (/var/lib/kubelet, ...)
        that was not there before it started. Empty when it left nothing behind."""
        found = [f"mount {m}" for m in mounts_under(self.workdir)]
        if self._namespace_name and (NETNS_RUN_DIR / self._namespace_name).exists():
            found.append(f"network namespace {self._namespace_name}")
        if self.workdir.exists():
            found.append(f"directory {self.workdir}")
        found += [f"machine-wide {p}" for p in sorted(present() - self._machine_paths_before)]
        marks = [str(self.workdir), *self._containers]
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                seen = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                seen += (proc / "cgroup").read_text()
                if any(mark in seen for mark in marks):
                    found.append(f"process {proc.name}: {seen.splitlines()[0][:200]}")
        for hierarchy, names in _cgroup_children().items():
            made = (names - self._cgroups_before.get(hierarchy, set())) & set(CGROUP_NAMES)
            found += [f"cgroup {hierarchy / name}" for name in sorted(made)]
            found += [f"cgroup {c}" for c in self._containers
                      if (hierarchy / "k8s.io" / c).exists()]  # fmt: skip
        return found

    def note_containers(self) -> None:
        """Remember containerd's containers now (leftovers() looks for their processes)."""
        self._containers.update(self._sandboxes())

    def __enter__(self) -> KubernetesCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- set-up ---------------------------------------------------------------------------------

    def _process(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.processes[name] = ManagedProcess(argv, name=name, env=env)
        self._commands[name] = (argv, env)

    def kill_and_restart(self, name: str) -> None:
        """SIGKILL one of the cluster's processes ("kubelet", "containerd") and start it
        again as it was, as a node's supervisor would: the pods' containers live on (their
        shims are containerd's children in name only). Call it from a thread that outlives
        the cluster: a child dies with the thread that started it (PR_SET_PDEATHSIG)."""
        process = self.processes[name]
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.stop(timeout=15)
        self._process(name, *self._commands[name])
        if name == "containerd":
            self._wait_containerd()

    def _node_address(self) -> None:
        """The node's address (the kubelet refuses a loopback one): the pods' bridge's,
        made before the CNI plugin would, which takes it as it is."""
        for argv in (["ip", "link", "add", BRIDGE, "type", "bridge"],
                     ["ip", "addr", "add", f"{NODE_ADDRESS}/24", "dev", BRIDGE],
                     ["ip", "link", "set", BRIDGE, "up"]):  # fmt: skip
            subprocess.run(self.inside(argv), check=True, capture_output=True, timeout=30)

    def _certificates(self) -> Path:
        pki = self.workdir / "pki"
        pki.mkdir(mode=0o700)
        self._authority = ca = Authority(pki, "kubernetes CA")
        names = ["kube-apiserver", "127.0.0.1", "localhost", "kubernetes",
                 "kubernetes.default", "kubernetes.default.svc", "10.96.0.1"]  # fmt: skip
        ca.issue("apiserver", names)
        ca.issue("apiserver-kubelet-client", ["kube-apiserver-kubelet-client"], client=True,
                 groups=("kubeadm:cluster-admins",))  # fmt: skip
        ca.issue("kubelet-server", [NODE, NODE_ADDRESS])
        ca.issue("kubelet-client", [f"system:node:{NODE}"], client=True, groups=("system:nodes",))
        key = ec.generate_private_key(ec.SECP256R1())
        pem = serialization.Encoding.PEM
        private = key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        public = key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
        (pki / "sa.key").write_bytes(private)
        (pki / "sa.key").chmod(0o600)
        (pki / "sa.pub").write_bytes(public)
        return pki

    def _start_etcd(self) -> None:
        local = f"http://127.0.0.1:{ETCD_PORT}"
        peer = f"http://127.0.0.1:{ETCD_PEER_PORT}"
        self._process("etcd", self.inside([
            str(self.debian / "usr/bin/etcd"), "--name", "kt", "--data-dir",
            str(self.workdir / "etcd"), "--listen-client-urls", local,
            "--advertise-client-urls", local, "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer, "--initial-cluster", f"kt={peer}",
            "--unsafe-no-fsync", "--log-level", "warn",
        ]))  # fmt: skip

    def _start_apiserver(self, pki: Path) -> None:
        assert self._authority is not None
        self._process("kube-apiserver", self.inside([
            str(self.home / "bin/kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
            "--bind-address=127.0.0.1", f"--secure-port={APISERVER_PORT}",
            f"--advertise-address={NODE_ADDRESS}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={self._authority.pem}",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=false",
            "--profiling=false",
            "--v=0",
        ]))  # fmt: skip

    def _start_relay(self) -> None:
        """The API server for the host's kubectl: a socat on the host's loopback hands each
        connection over a Unix socket to a socat inside, which connects to the API server."""
        sock = self.workdir / "apiserver.sock"
        self._process("relay-inside", self.inside([
            "socat", f"UNIX-LISTEN:{sock},fork,mode=600",
            f"TCP:127.0.0.1:{APISERVER_PORT},nodelay",
        ]))  # fmt: skip
        wait_for(sock.exists, timeout=10, what="the API server relay's socket")
        with socket.socket() as probe:  # a free port on the host's loopback
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._process("relay-host", [
            "socat", f"TCP-LISTEN:{self.port},bind=127.0.0.1,fork,reuseaddr,nodelay",
            f"UNIX-CONNECT:{sock}",
        ])  # fmt: skip
        self.processes["relay-host"].wait_accepting(self.port, timeout=10)

    def _wait_apiserver(self) -> None:
        assert self._authority is not None
        admin = self._authority.issue("admin", ["kubernetes-admin"], client=True,
                                      groups=("system:masters",))  # fmt: skip
        self._write_kubeconfig(self.workdir / "kubeconfig", "kubernetes-admin", admin)
        self.admin = User("kubernetes-admin", admin, self.workdir / "kubeconfig")
        apiserver = self.processes["kube-apiserver"]

        def ready() -> bool:
            if not apiserver.alive():
                raise RuntimeError(f"kube-apiserver exited: {apiserver.output()[-3000:]}")
            return bool(self.api("GET", "/readyz", timeout=5) == "ok")

        wait_for(ready, timeout=START_TIMEOUT, what="kube-apiserver to be ready", interval=0.5)

    def _write_kubeconfig(self, path: Path, user: str, issued: Issued) -> None:
        assert self._authority is not None
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kt", "cluster": {
                "server": self.server, "certificate-authority": str(self._authority.pem)}}],
            "users": [{"name": user, "user": {
                "client-certificate": str(issued.cert), "client-key": str(issued.key)}}],
            "contexts": [{"name": f"{user}@kt", "context": {"cluster": "kt", "user": user,
                                                          "namespace": "default"}}],
            "current-context": f"{user}@kt",
        }  # fmt: skip
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)

    def _containerd_env(self) -> dict[str, str]:
        path = f"{self.debian}/usr/bin:{self.debian}/usr/sbin:{os.environ.get('PATH', '')}"
        return {"PATH": path}

    @property
    def _containerd_socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    def _start_containerd(self) -> None:
        top = self.workdir / "containerd"
        cni = self.workdir / "cni"
        (cni / "net.d").mkdir(parents=True)
        (cni / "net.d" / "10-kt.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0",
            "name": "kt-pods",
            "plugins": [{
                "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
                "hairpinMode": True,
                "ipam": {"type": "host-local", "dataDir": str(cni / "ipam"),
                         "ranges": [[{"subnet": POD_SUBNET}]],
                         "routes": [{"dst": "0.0.0.0/0"}]},
            }],
        }))  # fmt: skip
        runc, plugins = self.debian / "usr/sbin/runc", self.debian / "usr/lib/cni"
        root, state, ttrpc, opt = (top / n for n in ("root", "state", "ttrpc.sock", "opt"))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""\
version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{self._containerd_socket}"
[ttrpc]
  address = "{ttrpc}"
[debug]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  stream_idle_timeout = "{self.streaming_idle_timeout}"
  enable_tls_streaming = false
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "{plugins}"
  conf_dir = "{cni}/net.d"
"""
        (top).mkdir()
        (top / "config.toml").write_text(config)
        self._process("containerd", self._on_node([
            str(self.debian / "usr/bin/containerd"), "--config", str(top / "config.toml"),
            "--log-level", "warn",
        ]), env=self._containerd_env())  # fmt: skip
        self._wait_containerd()

    def _wait_containerd(self) -> None:
        containerd = self.processes["containerd"]

        def answering() -> bool:
            if not containerd.alive():
                raise RuntimeError(f"containerd exited: {containerd.output()[-3000:]}")
            return self._ctr("version", timeout=5).returncode == 0

        wait_for(answering, timeout=60, what="containerd to answer", interval=0.25)

    def _ctr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv = [str(self.debian / "usr/bin/ctr"), "--address", str(self._containerd_socket),
                "--namespace", "k8s.io", *args]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self._containerd_env()})  # fmt: skip

    def _import_images(self) -> None:
        layer = self.workdir / "busybox.tar"
        write_busybox_layer(layer, self.debian / "bin/busybox")
        self.import_image(layer, BUSYBOX, PAUSE)

    def import_image(self, rootfs: Path, *images: Image) -> None:
        """`images` of the root file system `rootfs` (a tar), imported into containerd: no
        registry is asked, pods name them with imagePullPolicy Never. Once per cluster."""
        wanted = [image for image in images if image.name not in self._imported]
        if not wanted:
            return
        archive = self.workdir / "import.tar"
        try:
            write_image_archive(archive, rootfs, wanted)
            done = self._ctr("images", "import", str(archive), timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"ctr images import {rootfs}: {done.stderr.strip()}")
            self._imported.update(image.name for image in wanted)
        finally:
            archive.unlink(missing_ok=True)

    def _start_kubelet(self, pki: Path) -> None:
        assert self._authority is not None
        root = self.workdir / "kubelet"
        root.mkdir()
        (self.workdir / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_ADDRESS,
            "port": KUBELET_PORT,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(self._authority.pem)}},
            "authorization": {"mode": "AlwaysAllow"},
            "tlsCertFile": str(pki / "kubelet-server.crt"),
            "tlsPrivateKeyFile": str(pki / "kubelet-server.key"),
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self._containerd_socket}",
            "streamingConnectionIdleTimeout": self.streaming_idle_timeout,
            "podLogsDir": str(self.workdir / "pod-logs"),
            "resolvConf": str(self.workdir / "resolv.conf"),
            "clusterDomain": CLUSTER_DOMAIN,  # pods with a subdomain get their FQDN in /etc/hosts
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "registerNode": True,
        }  # fmt: skip
        (root / "config.yaml").write_text(json.dumps(config, indent=2))
        kubeconfig = self.workdir / "kubelet.kubeconfig"
        issued = Issued(pki / "kubelet-client.crt", pki / "kubelet-client.key",
                        pki / "kubelet-client.pem")  # fmt: skip
        self._write_kubeconfig(kubeconfig, f"system:node:{NODE}", issued)
        # the kubelet reaches the API server inside, not through the host's relay
        text = kubeconfig.read_text().replace(self.server, f"https://127.0.0.1:{APISERVER_PORT}")
        kubeconfig.write_text(text)
        self._process("kubelet", self._on_node([
            str(self.home / "bin/kubelet"), f"--config={root / 'config.yaml'}",
            f"--kubeconfig={kubeconfig}", f"--root-dir={root}",
            f"--hostname-override={NODE}", f"--node-ip={NODE_ADDRESS}", "--v=0",
        ]), env=self._containerd_env())  # fmt: skip

    def _wait_node_ready(self) -> None:
        kubelet = self.processes["kubelet"]

        def ready() -> bool:
            if not kubelet.alive():
                raise RuntimeError(f"the kubelet exited: {kubelet.output()[-3000:]}")
            node = self.api("GET", f"/api/v1/nodes/{NODE}", timeout=5)
            conditions = node.get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        wait_for(ready, timeout=START_TIMEOUT, what=f"node {NODE} to be Ready", interval=0.5)

    # -- tear-down ------------------------------------------------------------------------------

    def _delete_all_pods(self) -> None:
        pods = self.api("GET", "/api/v1/pods")["items"]
        for pod in pods:
            meta = pod["metadata"]
            with contextlib.suppress(ApiError):
                self.api("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                         {"gracePeriodSeconds": 0})  # fmt: skip

        def gone() -> bool:  # the kubelet removes stopped sandboxes only a minute later
            return not self.api("GET", "/api/v1/pods")["items"] and not self._running()

        wait_for(gone, timeout=STOP_TIMEOUT, what="the kubelet to stop every pod", interval=0.25)

    def _sandboxes(self) -> list[str]:
        """containerd's containers (pause ones among them), by id."""
        listing = self._ctr("containers", "list", "--quiet", timeout=10)
        return listing.stdout.split()

    def _running(self) -> list[str]:
        """The ids of containerd's tasks that still run (pods' containers and sandboxes)."""
        listing = self._ctr("tasks", "list", timeout=10).stdout.splitlines()[1:]
        return [line.split()[0] for line in listing if line.split()[2:3] == ["RUNNING"]]

    def _kill_containers(self) -> None:
        """What the kubelet did not stop (it died, or the wait ran out), killed."""
        for container in self._sandboxes():
            self._ctr("tasks", "delete", "--force", container, timeout=30)
            self._ctr("containers", "delete", container, timeout=30)


def pod_manifest(
    name: str,
    command: list[str],
    *,
    image: str = BUSYBOX_IMAGE,
    ports: dict[str, int] | None = None,
    labels: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    host_paths: dict[str, Path] | None = None,
) -> dict[str, Any]:
    """A pod on the node (it names it: there is no scheduler) running `command`, with `env`
    (the value `status.podIP` is the pod's address) and host directories mounted read-only
    (container path -> host path)."""
    mounts = sorted((host_paths or {}).items())
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": command,
        "ports": [{"name": k, "containerPort": v} for k, v in (ports or {}).items()],
        "env": [
            {"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}}
            if v == "status.podIP" else {"name": k, "value": v}
            for k, v in (env or {}).items()
        ],
        "volumeMounts": [{"name": f"host-{i}", "mountPath": inside, "readOnly": True}
                         for i, (inside, _) in enumerate(mounts)],
    }  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
            "volumes": [{"name": f"host-{i}", "hostPath": {"path": str(host)}}
                        for i, (_, host) in enumerate(mounts)],
        },
    }  # fmt: skip


@dataclass(frozen=True)
class Image:
    """An image to make from a root file system: its name and how its containers start."""

    name: str
    entrypoint: tuple[str, ...]
    env: tuple[str, ...] = ("PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",)


BUSYBOX = Image(BUSYBOX_IMAGE, ("/bin/sh",), ("PATH=/bin",))
PAUSE = Image(PAUSE_IMAGE, ("/bin/busybox", "sleep", "2147483647"), ("PATH=/bin",))
# Debian with its Java 17, for Kafka in pods: scripts/_setup.sh makes the root file system.
JAVA = Image("docker.io/kafkatunnel-tests/java:17", ("/bin/sh",))


def java_rootfs() -> Path:
    """The Debian root file system with Java 17 that scripts/_setup.sh made with debootstrap."""
    rootfs = Path.home() / ".cache" / "kafkatunnel" / "images" / "debian-java17.tar"
    if not rootfs.exists():
        raise KubernetesUnavailable(
            f"{rootfs} is missing: scripts/test makes it with debootstrap, as root "
            f"(source scripts/_setup.sh; kt_kubernetes)"
        )
    return rootfs


def write_busybox_layer(layer: Path, busybox: Path) -> None:
    """A root file system of Debian's static busybox alone, as a tar: the pods' first
    image and the pause image every pod sandbox starts with (a sleep outliving any test)."""
    with tarfile.open(layer, mode="w") as tar:
        for directory in ("bin", "etc", "tmp", "proc", "sys", "dev", "root"):
            info = tarfile.TarInfo(directory)
            info.type, info.mtime = tarfile.DIRTYPE, 0
            info.mode = 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        tar.addfile(info, io.BytesIO(data))
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mtime = tarfile.SYMTYPE, "busybox", 0
            tar.addfile(link)


def write_image_archive(archive: Path, layer: Path, images: list[Image]) -> None:
    """A docker-archive (what `ctr images import` takes) of `images`, each of the one
    layer `layer`, a root file system as a tar (debootstrap's, say)."""
    digest = hashlib.sha256()
    with layer.open("rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
    diff_id = digest.hexdigest()
    manifest = []
    with tarfile.open(archive, "w") as out:
        out.add(layer, arcname=f"{diff_id}/layer.tar")
        for image in images:
            config = json.dumps({
                "architecture": "amd64", "os": "linux",
                "config": {"Entrypoint": list(image.entrypoint), "Env": list(image.env)},
                "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
                "history": [{"created_by": f"kafkatunnel: {layer.name}"}],
            }).encode()  # fmt: skip
            config_name = f"{hashlib.sha256(config).hexdigest()}.json"
            _add(out, config_name, config)
            manifest.append({"Config": config_name,
                             "RepoTags": [image.name.removeprefix("docker.io/")],
                             "Layers": [f"{diff_id}/layer.tar"]})  # fmt: skip
        _add(out, "manifest.json", json.dumps(manifest).encode())


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), int(time.time())
    tar.addfile(info, io.BytesIO(data))


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below `directory`, as this process's mount table lists them."""
    prefix = str(directory)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return found


def _unmount_under(directory: Path) -> None:
    """Unmount what containerd and the kubelet left mounted in their directories (deepest
    first; lazily if still busy)."""
    for point in sorted(set(mounts_under(directory)), key=len, reverse=True):
        if subprocess.run(["umount", point], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)


CGROUP_NAMES = ("k8s.io", "kubepods", "kubepods.slice")  # what containerd and the kubelet make


def _cgroup_children() -> dict[Path, set[str]]:
    root = Path("/sys/fs/cgroup")
    hierarchies = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    return {h: {c.name for c in h.iterdir() if c.is_dir()} for h in hierarchies}


def _remove_new_cgroups(before: dict[Path, set[str]]) -> None:
    """The cgroups containerd or the kubelet made (empty once their processes are gone),
    deepest first; nobody else's."""
    for hierarchy, names in _cgroup_children().items():
        for name in names - before.get(hierarchy, set()):
            if name in CGROUP_NAMES:
                for path in sorted(_walk(hierarchy / name), key=lambda p: len(p.parts),
                                   reverse=True):  # fmt: skip
                    with contextlib.suppress(OSError):
                        path.rmdir()


def _walk(top: Path) -> Iterator[Path]:
    yield top
    with contextlib.suppress(OSError):
        for child in top.iterdir():
            if child.is_dir():
                yield from _walk(child)
