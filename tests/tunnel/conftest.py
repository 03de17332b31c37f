"""A tunnel into the isolated cluster, per test, on free loopback ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.tunnel import ExecForwarder, TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel

MakeTunnel = Callable[..., BackgroundTunnel]


@pytest.fixture
def make_tunnel(cluster: LocalCluster) -> Iterator[MakeTunnel]:
    started: list[BackgroundTunnel] = []

    def make(bootstrap: str | None = None, **options: object) -> BackgroundTunnel:
        settings: dict[str, object] = {"control": False, **options}
        config = TunnelConfig(
            bootstrap=bootstrap or cluster.mock[0].address,
            listen_port=free_port_run(8),
            **settings,  # type: ignore[arg-type]
        )
        tunnel = BackgroundTunnel(config, ExecForwarder(cluster.exec_template())).start()
        started.append(tunnel)
        return tunnel

    yield make
    for tunnel in started:
        tunnel.stop()
