"""A check of a port-forward that fails in itself is a failed check said in one line, never
a task that dies unobserved: the connection a probe opens can be closed under it before it
writes (kubectl hangs up on a pod port that refuses), and on uvloop, what `up` runs on,
writing to it then raises RuntimeError."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from kafkatunnel.kube.kubectl import Kubectl
from kafkatunnel.kube.portforward import PortForward, exchange
from kafkatunnel.probe import api_versions_request

LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {
    "uvloop": uvloop.run,
    "asyncio": asyncio.run,
}


@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_probe_whose_connection_closed_before_it_wrote_says_closed(loop: str) -> None:
    async def run() -> None:
        server = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.transport.abort()  # closed under the probe, as kubectl closes it
            await asyncio.sleep(0)
            said = await exchange(reader, writer, api_versions_request(), 5, "ApiVersions")
        assert said == "closed"

    LOOPS[loop](run())


def test_a_check_that_breaks_is_said_in_one_line_and_no_task_dies_unobserved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The supervisor's check task ends with the probe's error: it is logged as one warning
    naming the forward, and asyncio has nothing to report when the task is collected."""
    unobserved: list[dict[str, Any]] = []

    async def breaks(port: int, timeout: float) -> str | None:
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")

    async def pod() -> str:
        return "kafka-0"

    async def run() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, context: unobserved.append(
            context))  # fmt: skip
        forward = PortForward(Kubectl(), pod, 9092, lambda: None, probe=breaks)
        # a forward that is up: its kubectl (any living process) and its local port
        forward.process = await asyncio.create_subprocess_exec("sleep", "60")
        forward.pod, forward.local_port = "kafka-0", 40000
        try:
            forward.check("a test")
            assert forward._probing is not None
            await asyncio.wait([forward._probing])
            forward._probing = None
            gc.collect()  # a task whose error was never retrieved is reported as it goes
            await asyncio.sleep(0)
        finally:
            forward.process.kill()
            await forward.process.wait()

    with caplog.at_level(logging.WARNING, logger="kafkatunnel.kube"):
        uvloop.run(run())
    assert unobserved == [], unobserved
    said = [r.getMessage() for r in caplog.records if r.name == "kafkatunnel.kube"]
    assert said == ["checking the port-forward to pod/kafka-0 :9092 failed: RuntimeError: "
                    "unable to perform operation on <TCPTransport closed=True>"], said  # fmt: skip
