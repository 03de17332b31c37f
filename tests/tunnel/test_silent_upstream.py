"""A broker stream that opens and then never answers (a forward whose far end hangs, a
listener that takes connections it never serves): a TLS handshake or a login on it gives up
within --connect-timeout, lets go of the stream, and has the forward checked, as a first
answer that never came does; and a connection whose work fails in a way no input should
cause ends, saying so, while the tunnel goes on.

The silent listener is a fault, not a broker: no real broker can be made to hang on demand."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kafkatunnel.demo import free_port_run
from kafkatunnel.hostnames import split_address
from kafkatunnel.tunnel import TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel
from kafkatunnel.tunnel.forwarders import DirectForwarder, Upstream
from kafkatunnel.tunnel.login import Credentials
from kafkatunnel.tunnel.oauth_token import TokenEndpoint, TokenSource
from kafkatunnel.waiting import wait_for

TIMEOUT = 1.0  # --connect-timeout here


class WatchedForwarder(DirectForwarder):
    """Straight to the broker, keeping what the tunnel suspected of each forward."""

    def __init__(self) -> None:
        super().__init__()
        self.suspected: list[str] = []

    def suspect(self, host: str, port: int, signal: str) -> None:
        self.suspected.append(signal)


class BrokenForwarder(DirectForwarder):
    """A forwarder with a bug: opening a stream raises what no forwarder should."""

    async def open(self, host: str, port: int) -> Upstream:
        raise RuntimeError("a bug in a forwarder")


@pytest.fixture
def silent() -> Iterator[socket.socket]:
    """A listener that takes every connection and never sends a byte."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    """Whether the peer closed the connection (an end or a reset) within `within` seconds,
    whatever it sent before."""
    deadline = time.monotonic() + within
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(4096):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        pass
    return False


def tunnel_to(broker: str, forwarder: DirectForwarder, **options: Any) -> BackgroundTunnel:
    config = TunnelConfig(bootstrap=broker, listen_port=free_port_run(8), control=False,
                          discover_at_start=False, connect_timeout=TIMEOUT, **options)  # fmt: skip
    return BackgroundTunnel(config, forwarder).start()


def trusting_nothing() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=None)


@pytest.mark.alone  # a bound on elapsed time
@pytest.mark.parametrize("secured", ["tls", "login"])
def test_a_broker_stream_that_never_answers_is_let_go_and_its_forward_checked(
    silent: socket.socket, secured: str
) -> None:
    options: dict[str, Any] = (
        {"tls": trusting_nothing()} if secured == "tls"
        else {"login": Credentials("PLAIN", "alice", b"pw")}
    )  # fmt: skip
    forwarder = WatchedForwarder()
    broker = f"127.0.0.1:{silent.getsockname()[1]}"
    tunnel = tunnel_to(broker, forwarder, **options)
    try:
        with socket.create_connection(split_address(tunnel.bootstrap_servers)) as client:
            silent.settimeout(5)
            upstream, _ = silent.accept()
            with upstream:
                started = time.monotonic()
                assert closed_by_peer(client, within=5), "the client was not let go"
                # the tunnel's stream to the broker is closed too, not kept waiting
                assert closed_by_peer(upstream, within=5), f"the {secured} stream was kept"
                assert time.monotonic() - started < 2 * TIMEOUT + 1
        wait_for(lambda: bool(forwarder.suspected), timeout=5, what="the forward checked")
        shown = tunnel.status()["endpoints"][0]
        said = {"tls": "no TLS handshake", "login": "no answer to the login"}[secured]
        assert f"{said} within {TIMEOUT:g}s" in shown["last_error"], shown  # the step that hung
    finally:
        tunnel.stop()


def test_a_token_endpoint_slower_than_the_connect_timeout_is_named_and_no_forward_checked(
    silent: socket.socket,
) -> None:
    """OAUTHBEARER, the token ended and the endpoint hangs: a client's connection fails at
    --connect-timeout saying the token endpoint did not answer, not that the broker gave no
    stream, and the forward (which is fine) is not checked."""
    hang = threading.Event()

    def fetch(endpoint: TokenEndpoint, within: float) -> tuple[int, bytes]:
        hang.wait(30)
        return 503, b"{}"

    url = "http://idp.example/token"
    tokens = TokenSource(TokenEndpoint(url, "kafkatunnel", b"s3cret"), fetch)
    login = Credentials("OAUTHBEARER", "kafkatunnel", b"", tokens=tokens)
    forwarder = WatchedForwarder()
    tunnel = tunnel_to(f"127.0.0.1:{silent.getsockname()[1]}", forwarder, login=login)
    try:
        with socket.create_connection(split_address(tunnel.bootstrap_servers)) as client:
            assert closed_by_peer(client, within=5), "the client was not let go"
        shown = tunnel.status()["endpoints"][0]
        assert f"no token from the token endpoint ({url}) within {TIMEOUT:g}s" in \
            shown["last_error"], shown  # fmt: skip
        assert forwarder.suspected == []
    finally:
        hang.set()
        tunnel.stop()


def test_a_connection_whose_work_breaks_ends_saying_so_and_the_tunnel_goes_on() -> None:
    tunnel = tunnel_to("127.0.0.1:9", BrokenForwarder())
    try:
        for _ in range(2):  # the first did not take the tunnel down
            with socket.create_connection(split_address(tunnel.bootstrap_servers)) as client:
                assert closed_by_peer(client, within=5), "the broken connection was kept"
        shown = tunnel.status()["endpoints"][0]
        assert "internal error: RuntimeError: a bug in a forwarder" in shown["last_error"]
        assert "kafkatunnel bug" in shown["last_error"]
        wait_for(lambda: tunnel.status()["endpoints"][0]["connections"] == 0, timeout=5,
                 what="the broken connections no longer counted")  # fmt: skip
    finally:
        tunnel.stop()
