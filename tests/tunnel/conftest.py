"""A tunnel into the isolated cluster, per test, on free loopback ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from kafkatunnel.localcluster import LocalCluster, free_port
from kafkatunnel.tunnel import ExecForwarder, TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel

MakeTunnel = Callable[..., BackgroundTunnel]


def free_port_run(count: int) -> int:
    """A port P such that P..P+count-1 are all free now."""
    import socket

    for _ in range(200):
        base = free_port()
        if base + count >= 65535:
            continue
        try:
            held = []
            for port in range(base, base + count):
                s = socket.socket()
                s.bind(("127.0.0.1", port))
                held.append(s)
            for s in held:
                s.close()
            return base
        except OSError:
            for s in held:
                s.close()
    raise RuntimeError("no run of free ports")


@pytest.fixture
def make_tunnel(cluster: LocalCluster) -> Iterator[MakeTunnel]:
    started: list[BackgroundTunnel] = []

    def make(bootstrap: str | None = None, **options: object) -> BackgroundTunnel:
        config = TunnelConfig(
            bootstrap=bootstrap or cluster.mock[0].address,
            listen_port=free_port_run(8),
            control_port=None,
            **options,  # type: ignore[arg-type]
        )
        tunnel = BackgroundTunnel(config, ExecForwarder(cluster.exec_template())).start()
        started.append(tunnel)
        return tunnel

    yield make
    for tunnel in started:
        tunnel.stop()
