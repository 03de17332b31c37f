"""Clients in containers on the laptop: a container (a network namespace joined by a veth
pair, as Docker makes one) reaches the cluster through the tunnel at host.docker.internal,
a name that resolves only inside it (--advertise)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.demo.workload import consume_group, produce
from kafkatunnel.tunnel import ExecForwarder, TunnelConfig, containers
from kafkatunnel.tunnel.background import BackgroundTunnel
from kafkatunnel.tunnel.tunnel import Audience
from tests.proc import socket_inodes
from tests.tunnel.container import HOST_ADDRESS, HOST_NAME, Container

MESSAGES = 30
WORKLOAD = ("-m", "kafkatunnel.demo.workload")


def test_a_container_uses_groups_on_every_coordinator_at_host_docker_internal(
    cluster: LocalCluster,
) -> None:
    topic = f"container-{uuid.uuid4().hex[:6]}"
    spread = cluster.groups_by_coordinator(1, prefix=f"{topic}-g")
    with Container() as box:
        port = free_port_run(8, host=HOST_ADDRESS)
        config = TunnelConfig(
            bootstrap=cluster.mock[0].address, listen_host=HOST_ADDRESS, listen_port=port,
            advertise=HOST_NAME, control=False,
        )  # fmt: skip
        with BackgroundTunnel(config, ExecForwarder(cluster.exec_template())) as tunnel:
            bootstrap = tunnel.bootstrap_servers
            assert bootstrap == f"{HOST_NAME}:{port}"
            produced = box.python(*WORKLOAD, "produce", bootstrap, topic, str(MESSAGES))
            assert produced.stdout.startswith(f"PRODUCED {MESSAGES}"), produced.stderr[-2000:]
            with ThreadPoolExecutor(len(spread)) as pool:  # a 3 s join each, all at once
                runs = {node: pool.submit(box.python, *WORKLOAD, "consume", bootstrap, group,
                                          topic, str(MESSAGES), "60")
                        for node, (group,) in sorted(spread.items())}  # fmt: skip
            for node, run in runs.items():
                consumed = run.result()
                assert consumed.stdout.startswith(f"CONSUMED {MESSAGES} NOT_COORDINATOR 0"), (
                    node, consumed.stdout, consumed.stderr[-2000:])  # fmt: skip
            aio = box.python("tests/tunnel/aio_consume.py", bootstrap, topic, str(MESSAGES),
                             f"{topic}-aio")  # fmt: skip
            assert aio.stdout.startswith(f"CONSUMED {topic}-aio {MESSAGES}"), aio.stderr[-2000:]
            listening = {e["tunnel"] for e in tunnel.status()["endpoints"]}
            assert all(a.startswith(f"{HOST_ADDRESS}:") for a in listening), listening
    with pytest.raises(socket.gaierror):  # the name the clients were told: theirs alone
        socket.getaddrinfo(HOST_NAME, port)


def test_up_names_the_bridge_whose_containers_can_reach_the_tunnel(
    cluster: LocalCluster,
) -> None:
    with Container() as box:
        port = free_port_run(8, host=HOST_ADDRESS)
        up = ManagedProcess(
            [
                sys.executable, "-m", "kafkatunnel", "up", "--no-table",
                "--bootstrap", cluster.mock[0].address, "--exec", cluster.exec_template(),
                "--listen", f"{HOST_ADDRESS}:{port}", "--advertise", HOST_NAME,
            ],
            name="kafkatunnel-up-bridge",
        )  # fmt: skip
        try:
            line = up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=30)
        finally:
            up.stop()
    assert line.group(1) == f"{HOST_NAME}:{port}"
    said = " ".join(up.output().split())
    assert (
        f"listening on {HOST_ADDRESS} ({box.bridge}), not loopback: the containers on "
        f"bridge {box.bridge} can reach your cluster" in said
    ), said


@pytest.mark.parametrize("told", [None, HOST_NAME], ids=["bridge address", "advertised name"])
def test_for_containers_serves_the_bridge_and_loopback_in_one_run(
    cluster: LocalCluster, told: str | None
) -> None:
    """up --for-containers on a given bridge: containers consume at the bridge's address (or
    at --advertise's name) with groups on every coordinator, with confluent-kafka and with
    aiokafka, while a host client does the same on loopback; nothing listens elsewhere."""
    topic = f"both-{uuid.uuid4().hex[:6]}"
    spread = cluster.groups_by_coordinator(3, prefix=f"{topic}-g")
    with Container() as box:
        port = free_port_run(8)
        up = ManagedProcess(
            [
                sys.executable, "-m", "kafkatunnel", "up", "--no-table",
                "--bootstrap", cluster.mock[0].address, "--exec", cluster.exec_template(),
                "--listen", f"127.0.0.1:{port}", "--for-containers",
                "--container-network", box.bridge, *(["--advertise", told] if told else []),
            ],
            name="kafkatunnel-up-containers",
        )  # fmt: skip
        try:
            host = up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=30).group(1)
            said_inside = up.wait_for_line(r"^containers: bootstrap\.servers=(\S+)$", timeout=5)
            inside = said_inside.group(1)
            assert (host, inside) == (f"127.0.0.1:{port}", f"{told or HOST_ADDRESS}:{port}")
            assert produce(host, topic, MESSAGES) == MESSAGES
            with ThreadPoolExecutor(2 * len(spread)) as pool:  # a 3 s join each, all at once
                runs = {node: (pool.submit(box.python, *WORKLOAD, "consume", inside, theirs,
                                           topic, str(MESSAGES), "60"),
                               pool.submit(consume_group, host, ours, topic, MESSAGES,
                                           timeout=60))
                        for node, (theirs, ours, _) in sorted(spread.items())}  # fmt: skip
            for node, (in_container, on_host) in runs.items():
                consumed, mine = in_container.result(), on_host.result()
                assert consumed.stdout.startswith(f"CONSUMED {MESSAGES} NOT_COORDINATOR 0"), (
                    node, consumed.stdout, consumed.stderr[-2000:])  # fmt: skip
                assert (mine.consumed, mine.coordinator_errors) == (MESSAGES, []), node
            aio_groups = [groups[2] for groups in spread.values()]  # one per coordinator
            aio = box.python("tests/tunnel/aio_consume.py", inside, topic, str(MESSAGES),
                             *aio_groups)  # fmt: skip
            assert aio.stdout.split("\n")[:-1] == [
                f"CONSUMED {group} {MESSAGES}" for group in aio_groups
            ], aio.stderr[-2000:]
            assert listening_addresses(up.pid) == {"127.0.0.1", HOST_ADDRESS}
        finally:
            up.stop()
    said = " ".join(up.output().split())
    assert f"containers on bridge {box.bridge} reach the tunnel at {HOST_ADDRESS}" in said


def listening_addresses(pid: int) -> set[str]:
    """The addresses a process's listening TCP sockets are bound to (IPv4 and IPv6)."""
    inodes = {str(inode) for inode in socket_inodes(pid)}
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                raw = bytes.fromhex(fields[1].split(":")[0])
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.add(socket.inet_ntop(family, words))
    return found


def test_where_containers_reach_the_tunnel_is_decided_or_explained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    desktop = containers.plan(None, platform="darwin")
    assert (desktop.audience, desktop.advertise) == (None, HOST_NAME)
    monkeypatch.setattr(containers, "DOCKER_BRIDGE", "kt-no-docker0")
    with pytest.raises(containers.ContainersError, match="is Docker installed and running"):
        containers.plan(None, platform="linux")
    with pytest.raises(containers.ContainersError, match="is not a network name"):
        containers.plan("-rm", platform="linux")
    with monkeypatch.context() as patch, pytest.raises(containers.ContainersError,
                                                        match="no docker command"):  # fmt: skip
        patch.setattr(shutil, "which", lambda _: None)
        containers.plan("kt-no-such-network", platform="linux")
    if shutil.which("docker") is not None:  # Docker's own client asks its engine, and says
        with pytest.raises(containers.ContainersError) as refused:  # what it answered
            containers.plan("kt-no-such-network", platform="linux")
        said = str(refused.value)
        assert said.startswith("docker network inspect kt-no-such-network: "), said
        assert "Cannot connect to the Docker daemon" in said or "not found" in said, said
    with Container() as box:
        bridged = containers.plan(box.bridge, platform="linux")
    assert bridged.audience == Audience(HOST_ADDRESS, HOST_ADDRESS)


# A container's client speaking TLS to the tunnel, verifying its certificate by the name it
# was told (librdkafka's default since 2.0, set here all the same).
SSL_ROUND_TRIP = """
import sys, uuid
from confluent_kafka import Consumer, Producer
bootstrap, ca = sys.argv[1], sys.argv[2]
tls = {"bootstrap.servers": bootstrap, "security.protocol": "SSL", "ssl.ca.location": ca,
       "ssl.endpoint.identification.algorithm": "https"}
topic = f"client-tls-{uuid.uuid4().hex[:6]}"
producer = Producer(tls)
delivered = []
for i in range(5):
    producer.produce(topic, b"%d" % i, on_delivery=lambda e, m: delivered.append(e is None))
producer.flush(30)
consumer = Consumer({**tls, "group.id": topic, "auto.offset.reset": "earliest"})
consumer.subscribe([topic])
got = 0
for _ in range(60):
    message = consumer.poll(1)
    if message is not None and message.error() is None:
        got += 1
    if got == 5:
        break
consumer.close()
print("DELIVERED", sum(delivered), "CONSUMED", got)
"""


@pytest.mark.parametrize("told", [None, HOST_NAME], ids=["bridge address", "advertised name"])
def test_client_tls_names_what_containers_are_told(
    cluster: LocalCluster, told: str | None, tmp_path: Path
) -> None:
    """up --client-tls --for-containers: the certificate names the bridge's address and
    --advertise's host, so a container's client that verifies the name it was told
    produces and consumes over TLS, as the host's client does at loopback."""
    with Container() as box:
        port = free_port_run(8)
        up = ManagedProcess(
            [
                sys.executable, "-m", "kafkatunnel", "up", "--no-table",
                "--bootstrap", cluster.mock[0].address, "--exec", cluster.exec_template(),
                "--listen", f"127.0.0.1:{port}", "--for-containers", "--client-tls",
                "--container-network", box.bridge, *(["--advertise", told] if told else []),
            ],
            name="kafkatunnel-up-client-tls", env={"KAFKATUNNEL_STATE_DIR": str(tmp_path)},
        )  # fmt: skip
        try:
            host = up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=30).group(1)
            inside = up.wait_for_line(r"^containers: bootstrap\.servers=(\S+)$", timeout=5)[1]
            ca = up.wait_for_line(r"^ssl\.ca\.location=(\S+)$", timeout=5).group(1)
            assert inside == f"{told or HOST_ADDRESS}:{port}"
            for bootstrap, run in ((inside, box.python), (host, _here)):
                result = run("-c", SSL_ROUND_TRIP, bootstrap, ca)
                assert result.stdout.strip() == "DELIVERED 5 CONSUMED 5", (
                    bootstrap, result.stdout, result.stderr[-2000:])  # fmt: skip
        finally:
            up.stop()


def _here(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)
