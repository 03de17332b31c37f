"""Asking the cluster straight through the forwarder, without a client: its brokers, as
transparent mode needs them (its connections are never read) and as a listener that
answers nothing before a login wants; and a group's coordinator and what it answers the
tunnel itself (the deployed group's offsets of --isolate-from-deployed). The forwarder's
streams carry the tunnel's TLS and login, when it makes them."""

from __future__ import annotations

import asyncio

from kafkatunnel.probe import (
    FIND_COORDINATOR,
    GROUP_COORDINATOR_VERSION,
    SASL_HANDSHAKE,
    ErrorAnswer,
    decode_answer,
    group_coordinator_request,
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
    answer = await answer_of(forwarder, host, port, metadata_request(1), timeout)
    return list(addresses_in(answer, 3, 1))


async def probe_login(
    forwarder: Forwarder, host: str, port: int, timeout: float
) -> tuple[str, ...] | None:
    """The SASL mechanisms host:port wants a login with before it answers anything else
    (probe.mechanisms_wanted); None: it wants none, or cannot be asked."""
    try:
        answer = await answer_of(forwarder, host, port, sasl_handshake_request(1), timeout)
        return mechanisms_wanted(decode_answer(answer, SASL_HANDSHAKE, 1))
    except (OSError, TimeoutError, ForwarderError, ProtocolError, ErrorAnswer):
        return None


async def group_coordinator(
    forwarder: Forwarder, host: str, port: int, group: str, timeout: float
) -> BrokerAddress:
    """The broker host:port names as `group`'s coordinator (as the cluster advertises it:
    learn it before reaching it, so its name is checked). ErrorAnswer on an error."""
    answer = await answer_of(forwarder, host, port, group_coordinator_request(group, 1), timeout)
    found = decode_answer(answer, FIND_COORDINATOR, GROUP_COORDINATOR_VERSION)
    if int(found.error_code):
        raise ErrorAnswer(int(found.error_code))
    return BrokerAddress(int(found.node_id), str(found.host), int(found.port))


async def answer_of(
    forwarder: Forwarder, host: str, port: int, request: bytes, timeout: float
) -> bytes:
    """The first whole frame host:port answers `request` with, on a stream of its own."""
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
