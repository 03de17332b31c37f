"""A tunnel into the isolated cluster, per test, on free loopback ports."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.tunnel import ExecForwarder, TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel

MakeTunnel = Callable[..., BackgroundTunnel]


def worker_dns_addresses() -> str:
    """A first broker address (--dns-first-address) of this worker's own: the default,
    127.0.0.2 and up with each broker's port, is every worker's, and two tests side by
    side would both bind 127.0.0.2:9092."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    return f"127.0.{10 + worker}.2"


@pytest.fixture
def make_tunnel(cluster: LocalCluster) -> Iterator[MakeTunnel]:
    started: list[BackgroundTunnel] = []

    def make(bootstrap: str | None = None, **options: object) -> BackgroundTunnel:
        settings: dict[str, object] = {"control": False, **options}
        if "dns_listen" in options and "first_dns_address" not in options:
            settings["first_dns_address"] = worker_dns_addresses()
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
