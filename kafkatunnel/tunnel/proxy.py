"""One client connection: the client's transport, its upstream through a forwarder, and the
Exchange that observes requests and rewrites responses in between. Flow control runs both
ways, so a slow client slows the broker rather than filling memory."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

from kafkatunnel.capture.recorder import Recording
from kafkatunnel.protocol.errors import ProtocolError
from kafkatunnel.protocol.passage import Chunk, Exchange, Pipe
from kafkatunnel.tunnel.forwarders import (
    WRITE_BUFFER_HIGH,
    WRITE_BUFFER_LOW,
    Forwarder,
    ForwarderError,
    Upstream,
)
from kafkatunnel.tunnel.registry import Endpoint

log = logging.getLogger("kafkatunnel.proxy")
Address = tuple[str, int]


class ClientConnection(asyncio.Protocol):
    def __init__(
        self,
        endpoint: Endpoint,
        forwarder: Forwarder,
        make_exchange: Callable[[Endpoint], Exchange | Pipe],
        connect_timeout: float,
        on_close: Callable[[ClientConnection], None],
        record: Callable[[Endpoint, Address, Address], Recording] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.forwarder = forwarder
        self.exchange = make_exchange(endpoint)
        self.connect_timeout = connect_timeout
        self.on_close = on_close
        self.record = record
        self.recording: Recording | None = None
        self.transport: asyncio.Transport | None = None
        self.upstream: Upstream | None = None
        self.peer = "?"
        self._closed = False
        self._connecting: asyncio.Task[None] | None = None
        self._early: list[Chunk] = []  # client bytes that came before the upstream was open

    # -- client side ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        if self.record is not None and peer:
            local = transport.get_extra_info("sockname")
            self.recording = self.record(self.endpoint, peer[:2], local[:2])
        self.endpoint.connections += 1
        self.endpoint.total_connections += 1
        self.transport.pause_reading()  # until the upstream is there
        self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        host, port = self.endpoint.advertised_host, self.endpoint.advertised_port
        try:
            self.upstream = await asyncio.wait_for(
                self.forwarder.open(host, port, self), self.connect_timeout
            )
        except (ForwarderError, TimeoutError, OSError) as error:
            reason = str(error) or f"no stream to {host}:{port} within {self.connect_timeout:g}s"
            self.fail(f"upstream {self.endpoint.advertised}: {reason}")
            return
        if self._closed:  # the client left while the upstream was being opened
            self.upstream.close()
            self.on_close(self)  # again, now with an upstream to wait for
            return
        for chunk in self._early:
            self.upstream.write(chunk)
        self._early.clear()
        assert self.transport is not None
        self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.endpoint.bytes_in += len(data)
        try:
            chunks = self.exchange.from_client(data)
        except ProtocolError as error:
            self.fail(f"client {self.peer} sent invalid Kafka protocol: {error}")
            return
        upstream = self.upstream
        if upstream is None:  # reading was paused, but some event loops deliver a first read
            self._early.extend(chunks)
        else:
            for chunk in chunks:
                upstream.write(chunk)
        if self.recording is not None:
            self.recording.from_client(chunks)

    def eof_received(self) -> bool | None:
        self.close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()

    def pause_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.resume_reading()

    # -- upstream side (Downstream protocol) ------------------------------------------------

    def upstream_data(self, data: bytes) -> None:
        if self._closed or self.transport is None:
            return
        self.endpoint.bytes_out += len(data)
        try:
            chunks = self.exchange.from_broker(data)
        except ProtocolError as error:
            self.fail(f"broker {self.endpoint.advertised} answered with invalid Kafka: {error}")
            return
        for chunk in chunks:
            self.transport.write(chunk)
        if self.recording is not None:
            self.recording.to_client(chunks)

    def upstream_lost(self, reason: str | None) -> None:
        if reason:
            self.fail(f"upstream {self.endpoint.advertised}: {reason}")
        else:
            self.close()

    def upstream_pause_writing(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def upstream_resume_writing(self) -> None:
        if self.transport is not None and not self._closed:
            self.transport.resume_reading()

    # -- ending -----------------------------------------------------------------------------

    def fail(self, message: str) -> None:
        """Close this connection only, recording why."""
        if not self._closed:
            log.warning("%s: %s", self.endpoint.local, message)
            self.endpoint.record_error(message)
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.endpoint.connections -= 1
        if self.recording is not None:
            self.recording.closed()
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        if self.transport is not None:
            self.transport.close()
        if self.upstream is not None:
            self.upstream.close()
        self.on_close(self)
