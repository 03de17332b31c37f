"""Bad input and faults: a bad client loses only its own connection, an unreachable broker
closes the client promptly and the tunnel says why, a taken port fails at start naming the
flag, and nothing listens beyond loopback unless asked."""

from __future__ import annotations

import asyncio
import logging
import re
import select
import socket
import time
import uuid
from typing import Any

import pytest

from kafkatunnel.demo import LocalCluster, free_port
from kafkatunnel.demo.workload import consume_group, produce
from kafkatunnel.hostnames import split_address
from kafkatunnel.tunnel import ExecForwarder, PortInUse, Tunnel, TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel
from kafkatunnel.waiting import DeadlineExceeded, wait_for
from tests.tunnel.conftest import MakeTunnel


def _closed_by_peer(sock: socket.socket, within: float) -> bool:
    """Whether the peer closed the connection (an end or a reset) within `within` seconds;
    False if it is still open then."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True  # recv returned b"": closed


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",  # a browser on the wrong port
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,  # a TLS client hello
        b"\x00\x00\x00\x06\xff\xff\x00\x00\x00\x01",  # a frame with api key -1
    ],
    ids=["http", "tls", "bad-header"],
)
def test_garbage_loses_only_its_own_connection(
    cluster: LocalCluster, make_tunnel: MakeTunnel, garbage: bytes
) -> None:
    tunnel = make_tunnel()
    host, port = split_address(tunnel.bootstrap_servers)
    topic = f"garbage-{uuid.uuid4().hex[:6]}"
    assert produce(tunnel.bootstrap_servers, topic, 10) == 10

    bad = socket.create_connection((host, port))
    bad.sendall(garbage)
    assert _closed_by_peer(bad, within=5)
    bad.close()

    bootstrap = tunnel.status()["endpoints"][0]
    assert bootstrap["errors"] >= 1
    assert "invalid Kafka protocol" in bootstrap["last_error"]
    # everyone else is unaffected
    assert produce(tunnel.bootstrap_servers, topic, 10, prefix="after") == 10
    result = consume_group(tunnel.bootstrap_servers, f"{topic}-g", topic, 20, timeout=60)
    assert result.consumed == 20


@pytest.mark.alone  # a bound on elapsed time
def test_unreachable_broker_closes_the_client_promptly_and_says_why(
    cluster: LocalCluster, make_tunnel: MakeTunnel
) -> None:
    with socket.socket() as s:  # a port with nobody listening inside the cluster
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    tunnel = make_tunnel(bootstrap=f"127.0.0.1:{dead}", discover_at_start=False)
    host, port = split_address(tunnel.bootstrap_servers)
    client = socket.create_connection((host, port))
    started = time.monotonic()
    assert _closed_by_peer(client, within=5)
    assert time.monotonic() - started < 5
    client.close()
    endpoint = wait_for(
        lambda: (e := tunnel.status()["endpoints"][0])["last_error"] and e,
        timeout=5,
        what="the error to show in the table",
    )
    assert "Connection refused" in endpoint["last_error"]
    assert f"127.0.0.1:{dead}" in endpoint["last_error"]


def _dead_port() -> int:
    with socket.socket() as s:  # a port with nobody listening inside the cluster
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fail_clients(tunnel: BackgroundTunnel, count: int) -> dict[str, Any]:
    """`count` clients at once, each closed by the tunnel; its bootstrap's status once all
    are counted. Each close waits for a forward command to start and fail, `count` of
    them at once: the deadline is for a busy machine (a prompt close has a test of its
    own, alone)."""
    host, port = split_address(tunnel.bootstrap_servers)
    clients = [socket.create_connection((host, port)) for _ in range(count)]
    still_open = set(clients)

    def all_closed() -> bool:
        readable, _, _ = select.select(list(still_open), [], [], 0.2)
        for client in readable:
            try:
                if client.recv(4096):
                    continue  # an answer: not closed
            except ConnectionResetError:
                pass
            still_open.discard(client)
        return not still_open

    try:
        wait_for(all_closed, timeout=60, what=f"the tunnel to close all {count} clients")
    except DeadlineExceeded as error:
        endpoint = tunnel.status()["endpoints"][0]
        raise AssertionError(f"{error}: {len(still_open)} still open; {endpoint}") from None
    finally:
        for client in clients:
            client.close()
    return wait_for(
        lambda: (e := tunnel.status()["endpoints"][0])["errors"] == count and e,
        timeout=30,
        what=f"status to count the {count} failures",
    )


def _counts(records: list[logging.LogRecord], told: str) -> list[tuple[int, str]]:
    """The lines counting repeats of a failure: (how many, the rest of the line)."""
    found = [re.search(r": (\d+) more connections? (.*)", r.getMessage()) for r in records]
    return [(int(m[1]), m[2]) for m in found if m and told in m[2]]


def test_a_flood_of_failing_connections_is_said_once_then_counted(
    cluster: LocalCluster, make_tunnel: MakeTunnel, caplog: pytest.LogCaptureFixture
) -> None:
    """50 clients at a broker whose forward fails every connection (as librdkafka
    reconnects when a token ended, a forward is down): the first failure is logged in full
    at once, the others only counted, and one line says how many once the window passed;
    status counts every one. The forward's stderr (a pid, the time) differs per connection,
    the client's port too: they are still the same failure."""
    dead, window = _dead_port(), 5.0
    upstream = f"upstream 127.0.0.1:{dead}: "
    with caplog.at_level(logging.WARNING, logger="kafkatunnel.proxy"):
        tunnel = make_tunnel(
            bootstrap=f"127.0.0.1:{dead}", discover_at_start=False, repeat_window=window
        )
        endpoint = _fail_clients(tunnel, 50)
        assert upstream in endpoint["last_error"], endpoint

        def lines() -> list[logging.LogRecord]:
            return [r for r in caplog.records if upstream in r.getMessage()]

        wait_for(
            lambda: sum(n for n, _ in _counts(lines(), upstream)) == 49,
            timeout=window + 15,
            what="a line counting the other 49",
        )
    full = [r for r in lines() if not _counts([r], upstream)]
    assert len(full) == 1, [r.getMessage() for r in full]
    said = full[0].getMessage()
    assert said.startswith(f"{tunnel.bootstrap_servers}: {upstream}"), said
    assert "Connection refused" in said, said
    assert len(lines()) <= 3, [r.getMessage() for r in lines()]  # not 50
    first_count = next(r for r in lines() if _counts([r], upstream))
    assert first_count.created - full[0].created >= window - 0.1  # once the window passed
    assert f"failed the same way in the last {window:g} s: " in first_count.getMessage()
    assert first_count.getMessage().endswith(said.split(": ", 1)[1])  # what, not only how many


def test_a_stop_within_the_window_says_how_many_more_failed(
    cluster: LocalCluster, make_tunnel: MakeTunnel, caplog: pytest.LogCaptureFixture
) -> None:
    dead = _dead_port()
    upstream = f"upstream 127.0.0.1:{dead}: "
    with caplog.at_level(logging.WARNING, logger="kafkatunnel.proxy"):
        tunnel = make_tunnel(bootstrap=f"127.0.0.1:{dead}", discover_at_start=False)
        _fail_clients(tunnel, 10)
        assert _counts(caplog.records, upstream) == []  # the window (30 s) goes on
        tunnel.stop()
    counts = _counts(caplog.records, upstream)
    assert [n for n, _ in counts] == [9], counts
    assert re.match(r"failed the same way in the last \d+(\.\d)? s: ", counts[0][1]), counts


def test_port_in_use_fails_at_start_naming_port_and_flag(cluster: LocalCluster) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    tunnel = Tunnel(
        TunnelConfig(bootstrap=cluster.mock[0].address, listen_port=port, control=False),
        ExecForwarder(cluster.exec_template()),
    )
    try:
        with pytest.raises(
            PortInUse, match=rf"port {port} on 127.0.0.1 is already in use.*--listen"
        ):
            asyncio.run(tunnel.start())
    finally:
        holder.close()


def test_listeners_bind_to_loopback_only(cluster: LocalCluster, make_tunnel: MakeTunnel) -> None:
    tunnel = make_tunnel()
    addresses = {acceptor.sock.getsockname()[0] for acceptor in tunnel.tunnel.acceptors}
    assert len(tunnel.tunnel.acceptors) == 4  # bootstrap + 3 brokers
    assert addresses == {"127.0.0.1"}


def test_a_pinned_broker_port_in_use_stops_the_start(
    cluster: LocalCluster, make_tunnel: MakeTunnel
) -> None:
    """A pinned port someone else holds is an error at start, naming the flag, rather than
    a port handed to clients while another program answers on it."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", free_port()))
    holder.listen()
    taken = holder.getsockname()[1]
    try:
        with pytest.raises(PortInUse, match=rf"port {taken} .*--broker-port 2=PORT"):
            make_tunnel(broker_ports={2: taken})
    finally:
        holder.close()


def test_requests_are_counted_across_connections(
    cluster: LocalCluster, make_tunnel: MakeTunnel
) -> None:
    from kafkatunnel.probe import ProbeConnection

    tunnel = make_tunnel()
    before = tunnel.status()["endpoints"][0]
    for _ in range(2):  # two connections, one Metadata request each
        with ProbeConnection(tunnel.bootstrap_servers) as probe:
            probe.brokers()
    after = tunnel.status()["endpoints"][0]
    assert after["requests"] == before["requests"] + 2
    metadata = before["api_requests"].get("Metadata", 0) + 2
    assert after["api_requests"] == {**before["api_requests"], "Metadata": metadata}
