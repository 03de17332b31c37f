"""A client connection's work is a task; a connection closed before that task first runs
(a client that connects and goes at once, a tunnel stopping) must leave no coroutine that
was never awaited behind: Python warns of each one, and a warning per lost client is
noise in the user's log."""

from __future__ import annotations

import asyncio
import gc
import socket
import warnings

import pytest

from kafkatunnel.protocol import PassThrough
from kafkatunnel.tunnel.failure_log import FailureLog
from kafkatunnel.tunnel.forwarders import ExecForwarder
from kafkatunnel.tunnel.proxy import ClientConnection
from kafkatunnel.tunnel.registry import Endpoint

pytestmark = pytest.mark.quick


def test_a_connection_closed_before_its_work_starts_leaves_no_unawaited_coroutine() -> None:
    async def connect_and_close() -> None:
        closed = asyncio.Event()
        endpoint = Endpoint(None, "kafka-0.kafka-headless", 9092, "127.0.0.1", 9092)
        connection = ClientConnection(
            endpoint,
            ExecForwarder("true {host} {port}"),
            lambda _: PassThrough(),
            connect_timeout=5,
            on_close=lambda _: closed.set(),
            failures=FailureLog(),
        )
        with socket.create_server(("127.0.0.1", 0)) as server:
            theirs = socket.create_connection(server.getsockname())
            ours, _ = server.accept()
        ours.setblocking(False)
        connection.start(ours)
        connection.close()  # in the same step of the loop: its work never ran
        await asyncio.wait_for(closed.wait(), 5)
        theirs.close()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(connect_and_close())
        gc.collect()
    never = [str(w.message) for w in caught if "was never awaited" in str(w.message)]
    assert never == []
