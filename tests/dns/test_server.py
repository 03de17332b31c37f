"""The DNS server on real sockets: UDP and TCP, and 10^4 bad packets never stop it."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from dnslib import RCODE, DNSRecord

from kafkatunnel.demo import free_port_run
from kafkatunnel.dns import DnsServer, Zone
from kafkatunnel.waiting import async_wait_for
from tests.dns import names_of

pytestmark = pytest.mark.quick

NAME = "kafka-0.kafka-headless.demo.svc.cluster.local"


def _zone() -> Zone:
    zone = Zone()
    zone.add(names_of(NAME), "127.0.0.2")
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


def test_port_53_without_privilege_names_the_fix(tmp_path: Path) -> None:
    """`up --dns` on port 53 without the right to bind it says so and names the fix. Run
    as root, the right is dropped first (setpriv: CAP_NET_BIND_SERVICE out of the bounding
    set, as for any user), so the test runs wherever the suite does."""
    import os
    import subprocess
    import sys

    import pytest

    if int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text()) <= 53:
        pytest.skip("this kernel lets anyone bind port 53")
    drop = ["setpriv", "--bounding-set", "-net_bind_service", "--inh-caps", "-net_bind_service"]
    up = [
        sys.executable, "-m", "kafkatunnel", "up", "--bootstrap", "kafka-0.kafka:9092",
        "--exec", "socat STDIO TCP:{host}:{port}", "--start-timeout", "0", "--no-table",
        "--listen", f"127.0.0.1:{free_port_run(4)}", "--dns", "--dns-listen", "127.0.0.1:53",
        "--dns-setup", "none",
    ]  # fmt: skip
    result = subprocess.run(
        [*(drop if os.geteuid() == 0 else []), *up], capture_output=True, text=True, timeout=60,
        env={**os.environ, "KAFKATUNNEL_STATE_DIR": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cannot serve DNS on 127.0.0.1:53" in result.stderr
    assert "port 53 needs root (or CAP_NET_BIND_SERVICE), or choose --dns-listen" in result.stderr
