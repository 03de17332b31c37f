"""Clients in containers on the laptop: a container (a network namespace joined by a veth
pair, as Docker makes one) reaches the cluster through the tunnel at host.docker.internal,
a name that resolves only inside it (--advertise)."""

from __future__ import annotations

import socket
import sys
import uuid

import pytest

from kafkatunnel.localcluster import LocalCluster, free_port_run
from kafkatunnel.localcluster.processes import ManagedProcess
from kafkatunnel.tunnel import ExecForwarder, TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel
from tests.tunnel.container import HOST_ADDRESS, HOST_NAME, Container

MESSAGES = 30


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
            workload = ("-m", "kafkatunnel.localcluster.workload")
            produced = box.python(*workload, "produce", bootstrap, topic, str(MESSAGES))
            assert produced.stdout.startswith(f"PRODUCED {MESSAGES}"), produced.stderr[-2000:]
            for node, (group,) in sorted(spread.items()):
                consumed = box.python(*workload, "consume", bootstrap, group, topic,
                                      str(MESSAGES), "60")  # fmt: skip
                assert consumed.stdout.startswith(f"CONSUMED {MESSAGES} NOT_COORDINATOR 0"), (
                    node, consumed.stdout, consumed.stderr[-2000:])  # fmt: skip
            aio = box.python("tests/tunnel/aio_consume.py", bootstrap, f"{topic}-aio", topic,
                             str(MESSAGES))  # fmt: skip
            assert aio.stdout.startswith(f"CONSUMED {MESSAGES}"), aio.stderr[-2000:]
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
