"""Asking the cluster for its brokers straight through the forwarder, without a client:
what transparent mode needs, since its connections are never read."""

from __future__ import annotations

import asyncio

from kafkatunnel.probe import metadata_request
from kafkatunnel.protocol import BrokerAddress, FrameDecoder, addresses_in
from kafkatunnel.tunnel.forwarders import Forwarder, Upstream


async def probe_brokers(
    forwarder: Forwarder, host: str, port: int, timeout: float
) -> list[BrokerAddress]:
    """The brokers a plaintext Metadata request to host:port lists."""
    upstream = await asyncio.wait_for(forwarder.open(host, port), timeout)
    try:
        return await asyncio.wait_for(_ask(upstream), timeout)
    finally:
        await upstream.discard()


async def _ask(upstream: Upstream) -> list[BrokerAddress]:
    await upstream.send(metadata_request(1))
    decoder = FrameDecoder(max_frame_size=16 << 20)
    while True:
        data = await upstream.receive()
        if not data:
            reason = await upstream.why_ended(None)
            raise ConnectionError(reason or "closed before answering")
        frames = decoder.feed(data)
        if frames:
            return list(addresses_in(frames[0], 3, 1))
