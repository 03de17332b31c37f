"""Asking the cluster for its brokers straight through the forwarder, without a client:
what transparent mode needs, since its connections are never read."""

from __future__ import annotations

import asyncio

from kafkatunnel.probe import metadata_request
from kafkatunnel.protocol.errors import ProtocolError
from kafkatunnel.protocol.framing import FrameDecoder
from kafkatunnel.protocol.rewrite import BrokerAddress, addresses_in
from kafkatunnel.tunnel.forwarders import Forwarder


class _FirstFrame:
    def __init__(self) -> None:
        self.decoder = FrameDecoder(max_frame_size=16 << 20)
        self.frame: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def upstream_data(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except ProtocolError as error:
            if not self.frame.done():
                self.frame.set_exception(error)
            return
        if frames and not self.frame.done():
            self.frame.set_result(frames[0])

    def upstream_lost(self, reason: str | None) -> None:
        if not self.frame.done():
            self.frame.set_exception(ConnectionError(reason or "closed before answering"))

    def upstream_pause_writing(self) -> None:
        return None

    def upstream_resume_writing(self) -> None:
        return None


async def probe_brokers(
    forwarder: Forwarder, host: str, port: int, timeout: float
) -> list[BrokerAddress]:
    """The brokers a plaintext Metadata request to host:port lists."""
    collect = _FirstFrame()
    upstream = await asyncio.wait_for(forwarder.open(host, port, collect), timeout)
    try:
        upstream.write(metadata_request(1))
        answer = await asyncio.wait_for(collect.frame, timeout)
        return list(addresses_in(answer, 3, 1))
    finally:
        upstream.close()
