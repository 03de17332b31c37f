"""Asking the cluster for its brokers straight through the forwarder, without a client:
what transparent mode needs, since its connections are never read, and what a listener
that answers nothing before a login wants."""

from __future__ import annotations

import asyncio

from kafkatunnel.probe import (
    SASL_HANDSHAKE,
    ErrorAnswer,
    decode_answer,
    mechanisms_wanted,
    metadata_request,
    sasl_handshake_request,
)
from kafkatunnel.protocol import BrokerAddress, FrameDecoder, ProtocolError, addresses_in
from kafkatunnel.tunnel.forwarders import Forwarder, ForwarderError, Upstream


async def probe_brokers(
    forwarder: Forwarder, host: str, port: int, timeout: float
) -> list[BrokerAddress]:
    """The brokers a plaintext Metadata request to host:port lists."""
    answer = await _answer(forwarder, host, port, metadata_request(1), timeout)
    return list(addresses_in(answer, 3, 1))


async def probe_login(
    forwarder: Forwarder, host: str, port: int, timeout: float
) -> tuple[str, ...] | None:
    """The SASL mechanisms host:port wants a login with before it answers anything else
    (probe.mechanisms_wanted); None: it wants none, or cannot be asked."""
    try:
        answer = await _answer(forwarder, host, port, sasl_handshake_request(1), timeout)
        return mechanisms_wanted(decode_answer(answer, SASL_HANDSHAKE, 1))
    except (OSError, TimeoutError, ForwarderError, ProtocolError, ErrorAnswer):
        return None


async def _answer(
    forwarder: Forwarder, host: str, port: int, request: bytes, timeout: float
) -> bytes:
    """The first whole frame host:port answers `request` with."""
    upstream = await asyncio.wait_for(forwarder.open(host, port), timeout)
    try:
        return await asyncio.wait_for(_first_frame(upstream, request), timeout)
    finally:
        await upstream.discard()


async def _first_frame(upstream: Upstream, request: bytes) -> bytes:
    await upstream.send(request)
    decoder = FrameDecoder(max_frame_size=16 << 20)
    while True:
        data = await upstream.receive()
        if not data:
            reason = await upstream.why_ended(None)
            raise ConnectionError(reason or "closed before answering")
        frames = decoder.feed(data)
        if frames:
            return frames[0]
