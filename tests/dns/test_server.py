"""The DNS server on real sockets: UDP and TCP, and 10^4 bad packets never stop it."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Awaitable, Callable

from dnslib import RCODE, DNSRecord

from kafkatunnel.dns import DnsServer, Zone, broker_name
from kafkatunnel.waiting import async_wait_for

NAME = "kafka-0.kafka-headless.demo.svc.cluster.local"


def _zone() -> Zone:
    zone = Zone()
    zone.add(broker_name(NAME), "127.0.0.2")
    return zone


async def _udp_query(port: int, packet: bytes, timeout: float = 2.0) -> bytes:
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, packet)
        return await asyncio.wait_for(loop.sock_recv(sock, 4096), timeout)
    finally:
        sock.close()


def _caught_up(server: DnsServer, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return server.answered + server.dropped >= count

    return check


def test_udp_tcp_and_garbage_storm() -> None:
    async def run() -> None:
        server = DnsServer(_zone(), "127.0.0.1", 0)
        await server.start()
        try:
            good = DNSRecord.question(NAME)
            reply = DNSRecord.parse(await _udp_query(server.port, good.pack()))
            assert str(reply.rr[0].rdata) == "127.0.0.2"

            sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            rng = random.Random(53)
            valid = good.pack()
            seen_before = server.answered + server.dropped
            for i in range(10_000):
                if i % 2:
                    packet = rng.randbytes(rng.randint(0, 300))
                else:  # a real query cut short or with a byte changed
                    mutated = bytearray(valid[: rng.randint(0, len(valid))])
                    if mutated:
                        mutated[rng.randrange(len(mutated))] = rng.randrange(256)
                    packet = bytes(mutated)
                sender.sendto(packet, ("127.0.0.1", server.port))
                if i % 100 == 99:
                    # Paced, so the kernel drops none: the server must process every one.
                    await async_wait_for(
                        _caught_up(server, seen_before + i + 1), timeout=10, what="the server"
                    )
            sender.close()
            assert server.answered + server.dropped == seen_before + 10_000
            refused = DNSRecord.parse(
                await _udp_query(server.port, DNSRecord.question("example.com").pack())
            )
            assert refused.header.rcode == RCODE.REFUSED
            after = DNSRecord.parse(await _udp_query(server.port, valid))
            assert str(after.rr[0].rdata) == "127.0.0.2"

            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(len(valid).to_bytes(2, "big") + valid)
            size = int.from_bytes(await reader.readexactly(2), "big")
            over_tcp = DNSRecord.parse(await reader.readexactly(size))
            assert str(over_tcp.rr[0].rdata) == "127.0.0.2"
            writer.close()
        finally:
            await server.stop()

    asyncio.run(run())


def test_port_53_without_privilege_names_the_fix() -> None:
    import os

    import pytest

    if os.geteuid() == 0:
        pytest.skip("root may bind port 53")

    async def run() -> None:
        await DnsServer(_zone(), "127.0.0.1", 53).start()

    with pytest.raises(OSError, match="--dns-listen"):
        asyncio.run(run())
