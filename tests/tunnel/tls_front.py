"""TLS listeners in front of the mock cluster's brokers, made with socat's OPENSSL-LISTEN
(socat 1.7.4, OpenSSL 3), in the cluster's network.

Broker i advertises 127.0.0.1:P_i. Its TLS listener is 127.0.0.2:P_i, forwarding to the
broker, with a certificate for whatever names the test wants. The tunnel's exec forwarder
dials 127.0.0.2:{port} while TLS checks the advertised 127.0.0.1: the address dialled is
not the name checked, as behind a kubectl port-forward. SocketForwarder dials the same
listeners with a TCP socket opened inside the cluster's network: the tunnel's other TLS
path, OpenSSL on the socket, as behind a kubectl forward's local port."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
import subprocess
from pathlib import Path

from kafkatunnel.demo import LocalCluster
from kafkatunnel.tunnel.forwarders import Forwarder, ForwarderError, TcpUpstream, Upstream
from kafkatunnel.waiting import wait_for
from tests.pki import Issued

FRONT_HOST = "127.0.0.2"


class TlsFront:
    def __init__(
        self,
        cluster: LocalCluster,
        server: Issued,
        client_ca: Path | None = None,
        routes: dict[int, str] | None = None,
    ) -> None:
        """client_ca: require a client certificate signed by it (mTLS). routes: TLS port ->
        the plaintext HOST:PORT behind it (default: each mock broker's own port)."""
        self.cluster = cluster
        self.server = server
        self.client_ca = client_ca
        self.routes = routes or {b.port: f"127.0.0.1:{b.port}" for b in cluster.mock}
        self.processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> TlsFront:
        verify = f"cafile={self.client_ca},verify=1" if self.client_ca else "verify=0"
        try:
            for port, behind in self.routes.items():
                listen = (
                    f"OPENSSL-LISTEN:{port},bind={FRONT_HOST},reuseaddr,fork,"
                    f"cert={self.server.cert},key={self.server.key},{verify}"
                )
                argv = ["socat", listen, f"TCP:{behind}"]
                self.processes.append(
                    subprocess.Popen(
                        self.cluster.inside(argv),
                        stdin=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,  # with its per-connection children: one group
                    )
                )
            for port in self.routes:
                wait_for(
                    functools.partial(self._listening, port),
                    timeout=10,
                    what=f"socat's TLS listener on {FRONT_HOST}:{port}",
                )
        except BaseException:
            self.__exit__()
            raise
        return self

    def _listening(self, port: int) -> bool:
        try:
            self.cluster.connect(FRONT_HOST, port, timeout=0.5).close()
        except OSError:
            return False
        return True

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            process.wait(10)
        self.processes.clear()

    def exec_template(self, port_prefix: str = "") -> str:
        """Dial each broker's TLS listener on its port, or on that port behind a prefix
        (port_prefix "1": 19092 for 9092); the advertised host stays the name checked."""
        prefix = self.cluster.exec_template().split("socat ")[0]
        return prefix + f"socat STDIO TCP:{FRONT_HOST}:{port_prefix}{{port}}"


class SocketForwarder(Forwarder):
    """Each broker's TLS listener on a TCP socket connected from inside the cluster's network
    (setns): to the tunnel, a socket like a direct forward's or a port-forward's."""

    kind = "direct"

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster

    async def open(self, host: str, port: int) -> Upstream:
        try:
            sock = await asyncio.to_thread(self.cluster.connect, FRONT_HOST, port)
        except OSError as error:
            raise ForwarderError(f"cannot connect to {FRONT_HOST}:{port}: {error}") from None
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return TcpUpstream(sock)

    def describe(self, host: str, port: int) -> str:
        return f"tcp {FRONT_HOST}:{port} in the cluster's network"
